"""The search spaces `--generator` names: a built-in by its name, a user's own by
`package.module:factory`.

A factory is a function of the flags' `GeneratorOptions` that returns a `Generator`, or a
`Generator` class (its `from_options`). It is imported and called while the flags are turned
into the run configuration, so a wrong name stops the job before any work, saying what is
wrong: no such module, no such attribute, not a factory, a signature that does not take the
options, or something other than a generator value coming back (an exception raised by the
user's own code keeps its traceback). Several values propose the
union of their candidates.

Example: `examples/wide_generator.py`, run from the repository's root as
`python -m trainer.task --generator=examples.wide_generator:WideGenerator` (`python -m` puts
the current directory on the import path).

A new built-in search space is a module (its `Generator` with a `from_options`) and a line in
`GENERATORS`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence

from trainer.errors import InputError
from trainer.model.cross import CrossGenerator
from trainer.model.dnn import DNNGenerator
from trainer.model.kheads import KHeadGenerator
from trainer.model.linear import LinearGenerator
from trainer.model.subnetwork import (
    Generator,
    GeneratorOptions,
    IterationContext,
    UnionGenerator,
    propose,
)
from trainer.model.trees import TreesGenerator

GeneratorFactory = Callable[[GeneratorOptions], Generator]

GENERATORS: Mapping[str, type[Generator]] = {
    "dnn": DNNGenerator,
    "cross": CrossGenerator,
    "linear": LinearGenerator,
    "kheads": KHeadGenerator,
    "trees": TreesGenerator,
}


def name_of(generator: Generator) -> str:
    """How `--generator` names `generator`'s class: a built-in name, else module:class."""
    for name, cls in GENERATORS.items():
        if type(generator) is cls:
            return name
    return f"{type(generator).__module__}:{type(generator).__qualname__}"


def make_generator(specs: Sequence[str], options: GeneratorOptions) -> Generator:
    """The generator of `--generator=SPEC,...`: each spec's, or the union of several.

    Raises:
        InputError: no spec, one named twice, or one that does not make a generator (see
            `factory`).
    """
    flag = f"--generator={','.join(specs)}"
    if not specs:
        raise InputError(f"{flag}: name at least one search space ({_choices()}).")
    if len(set(specs)) != len(specs):
        raise InputError(f"{flag} names a value twice.")
    generators = tuple(_checked(spec, factory(spec), options) for spec in specs)
    return generators[0] if len(generators) == 1 else UnionGenerator(generators)


def factory(spec: str) -> GeneratorFactory:
    """The factory `spec` names: a built-in name or `package.module:factory`, imported.

    Raises:
        InputError: an unknown name; a module that is not found or fails to import; no such
            attribute; an attribute that is not a Generator class or a function of one
            argument (the GeneratorOptions).
    """
    if spec in GENERATORS:
        return GENERATORS[spec].from_options
    flag = f"--generator={spec}"
    module_name, colon, attribute = spec.partition(":")
    dotted = [*module_name.split("."), *attribute.split(".")]
    if not colon or not all(part.isidentifier() for part in dotted):
        raise InputError(f"{flag}: unknown generator; {_choices()}.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name + ".").startswith(e.name + "."):
            raise InputError(
                f"{flag}: module '{module_name}' not found. python -m trainer.task imports "
                "it from the current directory or the installed packages: run from the "
                "folder that holds it, or install it."
            ) from None
        raise InputError(f"{flag}: importing module '{module_name}' failed: {e}") from e
    try:
        target = functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise InputError(
            f"{flag}: module '{module_name}' has no attribute '{attribute}'."
        ) from None
    if inspect.isclass(target):
        if not issubclass(target, Generator):
            raise InputError(
                f"{flag}: {attribute} is a class but not a trainer.model.Generator; name a "
                "Generator subclass or a function that returns a Generator."
            )
        if inspect.isabstract(target):
            raise InputError(
                f"{flag}: {attribute} is abstract: implement generate_candidates(context)."
            )
        return target.from_options
    if not callable(target):
        raise InputError(
            f"{flag}: {attribute} ({type(target).__name__}) is not a generator factory "
            "(a Generator class, or a function of trainer.model.GeneratorOptions)."
        )
    home = (getattr(target, "__module__", None) or module_name).partition(".")[0]
    if not inspect.isfunction(target) or home in sys.stdlib_module_names:
        # Never called to find out: os:system takes one argument too.
        raise InputError(
            f"{flag}: {attribute} ({type(target).__name__} of {home}) is not a generator "
            "factory: name a Generator class, or a Python function of your own that takes "
            "trainer.model.GeneratorOptions and returns a Generator."
        )
    try:
        inspect.signature(target).bind(GeneratorOptions())
    except TypeError:
        raise InputError(
            f"{flag}: {attribute}{inspect.signature(target)} cannot be called with one "
            f"argument; a generator factory is `def {attribute.split('.')[-1]}(options: "
            "trainer.model.GeneratorOptions) -> trainer.model.Generator`."
        ) from None
    return target


def _checked(spec: str, make: GeneratorFactory, options: GeneratorOptions) -> Generator:
    """What `make` returns for `options`, checked: a Generator, a value (two calls return
    equal generators with the same repr, which the job dir records) that proposes candidates
    at iteration 0. An exception of the user's code itself keeps its traceback."""
    flag = f"--generator={spec}"
    generator, again = make(options), make(options)
    if not isinstance(generator, Generator):
        raise InputError(
            f"{flag}: the factory returned a {type(generator).__name__}, not a "
            "trainer.model.Generator."
        )
    if generator != again or repr(generator) != repr(again):
        raise InputError(
            f"{flag}: the factory's generators are not values (two calls gave {generator!r} "
            f"and {again!r}): make {type(generator).__name__} a "
            "@dataclasses.dataclass(frozen=True), so that a resumed job can tell it from "
            "another."
        )
    try:
        propose(generator, IterationContext(0))
    except ValueError as e:
        raise InputError(f"{flag}: {e}") from None
    return generator


def _choices() -> str:
    return (
        f"choose from {', '.join(sorted(GENERATORS))}, or name your own as package.module:factory"
    )
