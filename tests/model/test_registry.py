"""`--generator`'s registry (trainer/model/registry.py): built-in names, a user's own
`package.module:factory`, and what is wrong when it is not one."""

from __future__ import annotations

import dataclasses

import pytest

from examples import wide_generator
from tests.support import parsed_flags
from trainer import model, task
from trainer.errors import InputError
from trainer.model import GeneratorOptions, IterationContext

OPTIONS = GeneratorOptions(layer_size=8, initial_num_layers=1, dropout=0.25, seed=3)
HERE = __name__  # this module, as `--generator` names it: tests.model.test_registry


@pytest.mark.parametrize(
    "specs, expected",
    [
        (["dnn"], model.DNNGenerator(layer_size=8, initial_num_layers=1, dropout=0.25)),
        (["cross"], model.CrossGenerator(layer_size=8)),
        (["linear"], model.LinearGenerator()),
        (
            ["linear", "examples.wide_generator:WideGenerator"],
            model.UnionGenerator((model.LinearGenerator(), wide_generator.WideGenerator(8))),
        ),
        (["examples.wide_generator:wide_and_deep"], wide_generator.wide_and_deep(OPTIONS)),
    ],
)
def test_a_spec_makes_its_generator_from_the_flags_options(specs, expected):
    assert model.make_generator(specs, OPTIONS) == expected


def test_the_built_in_names_are_the_registrys():
    assert list(model.GENERATORS) == ["dnn", "cross", "linear", "kheads", "trees"]
    for name, cls in model.GENERATORS.items():
        assert model.name_of(cls.from_options(OPTIONS)) == name
    assert model.name_of(wide_generator.WideGenerator()) == "examples.wide_generator:WideGenerator"


def test_the_example_grows_in_width():
    generator = wide_generator.WideGenerator.from_options(OPTIONS)
    first = generator.generate_candidates(IterationContext(0))
    assert [b.name for b in first] == ["wide_8", "wide_16"]
    later = generator.generate_candidates(IterationContext(1, previous_ensemble=(first[1],)))
    assert [b.name for b in later] == ["wide_16", "wide_32"]


def test_a_resumed_job_tells_a_users_generators_apart(tmp_path):
    def fingerprint(*args):
        with parsed_flags(["--train_data=x.csv", "--label_column=y", *args]) as f:
            return task.build_config(f).fingerprint()["generator"]

    wide = fingerprint("--generator=examples.wide_generator:WideGenerator")
    assert wide == fingerprint("--generator=examples.wide_generator:WideGenerator")
    assert wide == "WideGenerator(units=64)"
    assert wide != fingerprint(
        "--generator=examples.wide_generator:WideGenerator", "--layer_size=8"
    )
    assert wide != fingerprint("--generator=examples.wide_generator:wide_and_deep")


# Factories that are not what `--generator` takes, named as tests.model.test_registry:NAME.
class NotAValue(model.Generator):
    def generate_candidates(self, context):
        return [model.LinearBuilder()]


@dataclasses.dataclass(frozen=True)
class ProposesNothing(model.Generator):
    def generate_candidates(self, context):
        return []


def two_arguments(options, extra):
    return model.LinearGenerator()


def returns_a_builder(options):
    return model.LinearBuilder()


NOT_CALLABLE = 3


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "tree",
            "--generator=tree: unknown generator; choose from cross, dnn, kheads, linear, trees,",
        ),
        ("my module:make", "--generator=my module:make: unknown generator"),
        ("no_such_package_x.gen:make", "module 'no_such_package_x.gen' not found"),
        (
            "examples.wide_generator:Wide",
            "module 'examples.wide_generator' has no attribute 'Wide'",
        ),
        ("examples.wide_generator:WideBuilder", "WideBuilder is a class but not a trainer.model"),
        ("trainer.model:Generator", "Generator is abstract: implement generate_candidates"),
        (f"{HERE}:NOT_CALLABLE", "NOT_CALLABLE (int) is not a generator factory"),
        # A function of one argument that is no factory is never called (it was, issue 43).
        ("os:system", "system (builtin_function_or_method of posix) is not a generator factory"),
        ("shutil:rmtree", "rmtree (function of shutil) is not a generator factory"),
        (f"{HERE}:two_arguments", "two_arguments(options, extra) cannot be called with one arg"),
        (f"{HERE}:returns_a_builder", "the factory returned a LinearBuilder, not a trainer.model"),
        (f"{HERE}:NotAValue", "the factory's generators are not values"),
        (f"{HERE}:ProposesNothing", "ProposesNothing proposed no subnetwork in iteration 0"),
        ("dnn,dnn", "--generator=dnn,dnn names a value twice."),
        ("", "name at least one search space"),
    ],
)
def test_a_spec_that_is_not_a_generator_says_what_is_wrong(spec, message):
    with pytest.raises(InputError) as raised:
        model.make_generator(spec.split(",") if spec else [], OPTIONS)
    assert message in str(raised.value)


def test_a_module_that_fails_to_import_is_told_from_one_not_found(tmp_path, monkeypatch):
    (tmp_path / "needs_a_missing_package.py").write_text("import no_such_dependency_x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match="importing module 'needs_a_missing_package' failed: No"):
        model.make_generator(["needs_a_missing_package:make"], OPTIONS)


def test_the_options_are_checked_by_the_flags_rules():
    with pytest.raises(InputError, match=r"--dropout \(1.0\) must be in \[0, 1\)"):
        GeneratorOptions(dropout=1.0)
