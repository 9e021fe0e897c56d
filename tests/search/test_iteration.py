"""The iteration loop in process: divergence handling, export equality, the strategy scope."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from tests.support import parsed_flags
from trainer import ensemble as ens
from trainer import task
from trainer.config import TrainOptions
from trainer.input.features import PREVIOUS_LOGITS, PREVIOUS_OUTPUTS, Preprocessor, encoded
from trainer.input.schema import Embedded, HeadType, Label
from trainer.job import job as job_lib
from trainer.model import Builder, DNNBuilder, Inputs
from trainer.model.heads import Head
from trainer.search import record as record_lib
from trainer.search.factory import Models
from trainer.search.iteration import Iteration
from trainer.storage import job_dir as job_dir_lib


def _config(args):
    with parsed_flags(args):
        return task.build_config(flags.FLAGS)


@pytest.mark.slow
def test_exported_model_predicts_exactly_what_the_trainer_computes(binary_data, tmp_path):
    config = _config(
        [
            f"--train_data={binary_data.train}",
            f"--eval_data={binary_data.eval}",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            "--max_iterations=2",
            "--max_iteration_steps=150",
            "--batch_size=32",
            "--learn_mixture_weights",
            "--mixture_weight_type=vector",
            "--use_bias",
        ]
    )
    report = job_lib.run(config)
    job = job_dir_lib.JobDir(config.job_dir)
    data = job_lib.prepare_input(config, job)
    models = Models(config, data.schema)
    ensemble = models.restore(record_lib.finished(job), job)
    assert [m.key for m in ensemble.members] == [
        m["key"] for m in report["architecture"]["members"]
    ]

    loaded = tf.saved_model.load(str(tmp_path / "job" / "model"))
    # Only the chosen ensemble is inside: its members' and mixture weights' variables, no
    # other candidate's (AdaNet 0.9 exported every candidate of the last iteration); a
    # dropout layer's seed is training state, which serving never reads.
    chosen = sum(
        1
        for m in ensemble.members
        for v in m.subnetwork.checkpoint_variables().values()
        if "seed_generator" not in v.name
    ) + len(ensemble.weights.variables)
    saved = [
        name
        for name, _ in tf.train.list_variables(
            str(tmp_path / "job" / "model" / "variables" / "variables")
        )
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
    ]
    assert len(saved) == chosen
    serve = loaded.signatures["serving_default"]
    preprocessor = Preprocessor(data.schema)
    correct = rows = 0
    for features, labels in data.eval_raw():
        own_logits = ensemble.logits(preprocessor(features)).numpy()
        own = models.head.predictions(tf.constant(own_logits))
        served = serve(**features)
        np.testing.assert_allclose(served["logits"].numpy(), own_logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            served["probabilities"].numpy(), own["probabilities"].numpy(), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_array_equal(served["classes"].numpy(), own["classes"].numpy())
        assert set(served) == {"logits", "probabilities", "class_ids", "classes"}
        correct += int(np.sum(served["class_ids"].numpy() == labels.numpy()))
        rows += len(labels)
    assert rows == report["final"]["examples"] == 500
    assert correct / rows == pytest.approx(report["final"]["metrics"]["accuracy"])


@dataclasses.dataclass(frozen=True)
class ExplodingBuilder(Builder):
    """A subnetwork whose logits overflow to infinity: its loss is never finite."""

    @property
    def name(self):
        return "exploding"

    @property
    def complexity(self):
        return 1.0

    def build_body(self, *, input_dim, seed):
        return keras.layers.Lambda(lambda x: x * 1e30 + 1e38)


HEAD = Head(Label("y", HeadType.BINARY, classes=("a", "b")))


LEARNED = ens.ComplexityRegularizedEnsembler(learn_mixture_weights=True)


def _iteration(
    builders,
    *,
    strategy=None,
    specs=None,
    inputs=None,
    decay_steps=None,
    previous=None,
    ensembler=LEARNED,
    **options,
):
    names = [b.name for b in builders]
    return Iteration(
        number=0 if previous is None else previous.members[-1].iteration + 1,
        head=HEAD,
        inputs=inputs or Inputs(4),
        seed=1,
        builders=builders,
        specs=specs
        or ens.candidate_specs([ens.GrowStrategy()], names, has_previous=previous is not None),
        ensemblers=[ensembler],
        previous=previous,
        options=TrainOptions(batch_size=8, learning_rate=0.01, **options),
        strategy=strategy or tf.distribute.get_strategy(),
        decay_steps=decay_steps,
    )


def _batches(n_features=4, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(256, n_features)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return iter(tf.data.Dataset.from_tensor_slices((encoded(x), y)).repeat().batch(batch))


def test_a_diverged_candidate_stops_and_is_never_selected():
    iteration = _iteration([DNNBuilder(1, 8), ExplodingBuilder()])
    diverged = iteration.train(_batches(), 20)
    assert "t0_exploding" in diverged
    assert "grow_exploding_complexity_regularized" in diverged
    assert "t0_exploding" in iteration.stopped
    scores = iteration.scores(iteration.moving_average_objectives())
    chosen = iteration.candidates[ens.choose(scores, force_grow=False)]
    assert chosen.name == "grow_dnn_1x8_complexity_regularized"
    # Training goes on for the healthy candidate only, with finite weights.
    before = int(iteration.step.numpy())
    assert iteration.train(_batches(seed=1), 10) == []
    assert int(iteration.step.numpy()) == before + 10
    for variable in iteration.subnetworks[0].trainable_variables:
        assert np.isfinite(variable.numpy()).all()
    assert not iteration.is_exhausted


def test_every_candidate_diverged_stops_training_with_a_clear_error():
    iteration = _iteration([ExplodingBuilder()])
    iteration.train(_batches(), 5)
    assert iteration.is_exhausted
    scores = iteration.scores(iteration.moving_average_objectives())
    with pytest.raises(ens.selection.TrainingError, match="diverged"):
        ens.choose(scores, force_grow=False)


def test_train_steps_run_under_a_distribution_strategy():
    """The same loop under MirroredStrategy on two logical CPU devices: both replicas train
    and their copies of every variable stay identical (gradients are all-reduced), the
    embedding tables' sparse updates included."""
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < 2:
        pytest.skip("needs two logical CPUs, configured before TensorFlow starts")
    strategy = tf.distribute.MirroredStrategy([d.name for d in cpus[:2]])
    iteration = _iteration(
        [DNNBuilder(1, 8)], strategy=strategy, inputs=Inputs(4, (Embedded("id", 30, 3),))
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30, size=(256, 1))
    batches = iter(
        strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices(
                (
                    encoded(rng.normal(size=(256, 4)).astype(np.float32), ids),
                    (ids[:, 0] % 2).astype(np.int64),
                )
            )
            .repeat()
            .batch(8)
        )
    )
    subnetwork = iteration.subnetworks[0]
    variables = list(subnetwork.checkpoint_variables().values())
    initial = [v.numpy() for v in variables]
    iteration.train(batches, 30)
    assert int(iteration.step.numpy()) == 30
    assert np.isfinite(iteration.moving_average_objectives()).all()
    assert len(variables) == 5  # the table, two dense layers' kernels and biases
    for variable, before in zip(variables, initial):
        replicas = [v.numpy() for v in variable.values]
        assert len(replicas) == 2
        np.testing.assert_array_equal(replicas[0], replicas[1])
        assert not np.allclose(replicas[0], before)


def test_divergence_survives_a_restart(tmp_path):
    original = _iteration([DNNBuilder(1, 8), ExplodingBuilder()])
    original.train(_batches(), 5)
    prefix = original.checkpoint().write(str(tmp_path / "ckpt"))
    restored = _iteration([DNNBuilder(1, 8), ExplodingBuilder()])
    restored.checkpoint().read(prefix).assert_existing_objects_matched()
    assert set(restored.stop_diverged()) == {
        "t0_exploding",
        "grow_exploding_complexity_regularized",
    }
    assert restored.stop_diverged() == []
    assert restored.active() == ([0], [0])


@pytest.mark.parametrize(
    "replicas", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["one_replica", "mirrored"]
)
def test_the_cosine_schedule_ends_learning_at_its_last_step(replicas):
    """With decay_steps=10 the rate is 0 from step 11 on: training on changes nothing
    (subnetworks, mixture weights and embedding tables), on the tensor loop of one replica
    and on the variables of synchronous replicas; without a schedule it does."""
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < replicas:
        pytest.skip("needs two logical CPUs, configured before TensorFlow starts")
    strategy = tf.distribute.MirroredStrategy([d.name for d in cpus[:2]]) if replicas == 2 else None

    def trained(decay_steps):
        iteration = _iteration(
            [DNNBuilder(1, 8)],
            strategy=strategy,
            inputs=Inputs(4, (Embedded("id", 30, 3),)),
            decay_steps=decay_steps,
        )
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 30, size=(256, 1))
        data = tf.data.Dataset.from_tensor_slices(
            (
                encoded(rng.normal(size=(256, 4)).astype(np.float32), ids),
                (ids[:, 0] % 2).astype(np.int64),
            )
        ).repeat()
        batches = iter(
            strategy.experimental_distribute_dataset(data.batch(8)) if strategy else data.batch(8)
        )
        variables = [
            *iteration.subnetworks[0].checkpoint_variables().values(),
            *(v for c in iteration.candidates for v in c.weights.trainable_variables),
        ]
        iteration.train(batches, 10)
        at_ten = [v.numpy() for v in variables]
        iteration.train(batches, 10)
        return [bool((v.numpy() != a).any()) for v, a in zip(variables, at_ten)]

    assert not any(trained(decay_steps=10))
    assert all(trained(decay_steps=None))


def test_a_residual_subnetwork_loss_is_that_of_the_previous_ensemble_grown_by_it():
    """With --subnetwork_loss=residual a new subnetwork's loss is taken on (n - 1) / n of the
    previous ensemble's logits plus 1 / n of its own (n members once grown), or all of the
    previous ensemble's with warm-started mixture weights; with own, on its own logits; in
    iteration 0 the two are the same."""
    first = _iteration([DNNBuilder(1, 8)], subnetwork_loss="residual")
    features, labels = next(_batches())
    own_loss = float(tf.reduce_mean(HEAD.loss(labels, first.subnetworks[0](features)[1])))
    assert float(first._losses(features, labels, [0], [])[1][0]) == pytest.approx(own_loss)
    first.train(_batches(), 20)
    previous = first.freeze(0)
    for loss in ("own", "residual"):
        second = _iteration([DNNBuilder(2, 8)], previous=previous, subnetwork_loss=loss)
        own = second.subnetworks[0](features)[1]
        logits = own if loss == "own" else previous.logits(features) / 2 + own / 2
        expected = float(tf.reduce_mean(HEAD.loss(labels, logits)))
        got = float(second._losses(features, labels, [0], [])[1][0])
        assert got == pytest.approx(expected, rel=1e-5), loss
    assert float(previous.logits(features)[0, 0]) != pytest.approx(float(own[0, 0]))
    warm = ens.ComplexityRegularizedEnsembler(warm_start_mixture_weights=True)
    second = _iteration([DNNBuilder(2, 8)], previous=previous, ensembler=warm)
    grown = second.candidates[1].weights  # the grow candidate, as it starts
    kept = float(previous.weights.weights[0])  # as trained in iteration 0
    assert [float(w) for w in grown.weights] == [pytest.approx(kept), 0.5]
    outputs = [m.subnetwork(features) for m in previous.members] + [second.subnetworks[0](features)]
    expected = float(tf.reduce_mean(HEAD.loss(labels, grown(outputs))))
    assert float(second._losses(features, labels, [0], [])[1][0]) == pytest.approx(expected)


@pytest.mark.parametrize(
    "weight_type", [ens.MixtureWeightType.SCALAR, ens.MixtureWeightType.MATRIX]
)
def test_the_previous_members_outputs_computed_once_train_as_the_members_do(weight_type):
    """An in-memory table carries the frozen previous members' outputs (computed once per
    iteration, in chunks): their logits alone when no mixture weights read a last layer, else
    (last layer, logits). A step that reads them computes the same losses, and trains the
    same weights, as one that runs the members."""
    ensembler = ens.ComplexityRegularizedEnsembler(
        learn_mixture_weights=True, mixture_weight_type=weight_type
    )
    first = _iteration([DNNBuilder(1, 8)], ensembler=ensembler)
    first.train(_batches(), 20)
    previous = first.freeze(0)
    derived = _iteration(
        [DNNBuilder(2, 8)], previous=previous, ensembler=ensembler
    ).previous_outputs()
    matrix = weight_type is ens.MixtureWeightType.MATRIX
    key = PREVIOUS_OUTPUTS if matrix else PREVIOUS_LOGITS
    assert derived is not None and derived.bytes_per_example == 4 * ((8 if matrix else 0) + 1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    features = derived(encoded(x), chunk=100)
    assert set(features) == {"dense", key}
    member = previous.members[0].subnetwork(encoded(x))
    if matrix:
        ((last, logits),) = features[key]
        np.testing.assert_allclose(last, member[0], rtol=1e-6, atol=1e-6)
    else:
        (logits,) = features[key]
    np.testing.assert_allclose(logits, member[1], rtol=1e-6, atol=1e-6)

    def trained(table):
        second = _iteration(
            [DNNBuilder(2, 8)], previous=previous, ensembler=ensembler, subnetwork_loss="residual"
        )
        batch = tf.nest.map_structure(lambda v: v[:8], table)
        losses = [t.numpy() for t in second._losses(batch, y[:8], [0], [0, 1])]
        second.train(iter(tf.data.Dataset.from_tensor_slices((table, y)).repeat().batch(8)), 30)
        weights = [v.numpy() for v in second.subnetworks[0].trainable_variables]
        return [*losses, *weights, second.moving_average_objectives()]

    computed, carried = trained(dict(encoded(x))), trained(features)
    for a, b in zip(computed, carried):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The step reads the carried outputs, not the members: other outputs, other losses.
    zeros = {**features, key: tf.nest.map_structure(tf.zeros_like, features[key])}
    assert not np.allclose(trained(zeros)[0], computed[0])


def test_a_finished_iteration_is_freed_before_the_next_one_is_built(
    binary_data, tmp_path, monkeypatch
):
    """An iteration's models, datasets and traced functions hold reference cycles, which only
    a full collection frees: the controller collects after each iteration (ames, 74 columns:
    peak RSS 1,071 -> 880 MB), so when iteration t + 1 is built, iteration t's object is
    gone. Automatic collection is off here, so nothing else frees it."""
    config = _config(
        [
            f"--train_data={binary_data.train}",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            "--max_iterations=3",
            "--max_iteration_steps=20",
            "--batch_size=64",
            "--force_grow",
            "--feature_importance_rows=0",
            "--bags=1",
        ]
    )
    built: list[weakref.ref] = []
    alive_when_built: list[list[bool]] = []
    build = Models.iteration

    def recording(self, *args, **kwargs):
        alive_when_built.append([ref() is not None for ref in built])
        iteration = build(self, *args, **kwargs)
        built.append(weakref.ref(iteration))
        return iteration

    monkeypatch.setattr(Models, "iteration", recording)
    gc.collect()
    gc.disable()
    try:
        job_lib.run(config)
    finally:
        gc.enable()
    assert alive_when_built == [[], [False], [False, False]]
