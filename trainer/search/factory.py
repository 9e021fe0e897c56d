"""Builds the models of a job from its schema and search config: an iteration's candidates
from a `Proposal`, and a finished iteration's frozen chosen ensemble from its record. Shared by
the controller and the evaluator, which rebuilds what the chief trains without reading the
training data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from trainer.config import RunConfig
from trainer.input.schema import Schema
from trainer.model import Builder, Inputs, Subnetwork
from trainer.model.heads import Head
from trainer.search.frozen import FrozenEnsemble, FrozenMember
from trainer.search.iteration import Iteration, Layout
from trainer.search.record import Architecture, IterationRecord
from trainer.search.rules import Proposal, Search
from trainer.storage.job_dir import JobDir


class Models:
    """The models of one job under `strategy` (laid out on a cluster by `layout`)."""

    def __init__(
        self,
        config: RunConfig,
        schema: Schema,
        *,
        strategy: tf.distribute.Strategy | None = None,
        layout: Callable[[int], Layout] = lambda num_subnetworks: Layout(),
        checkpoint_options: tf.train.CheckpointOptions | None = None,
    ):
        self.config = config
        self.search = Search(config.search)
        self.head = Head(schema.label)
        self.inputs = Inputs(
            schema.dense_width, schema.embedded, schema.plain_positions, schema.indicated_positions
        )
        self.strategy = strategy or tf.distribute.get_strategy()
        self.layout = layout
        self.checkpoint_options = checkpoint_options

    def iteration(self, proposal: Proposal, previous: FrozenEnsemble | None) -> Iteration:
        """The candidates of `proposal`, grown from `previous`, ready to train."""
        return Iteration(
            number=proposal.number,
            head=self.head,
            inputs=self.inputs,
            seed=self.config.training_seed,
            builders=proposal.builders,
            specs=proposal.specs,
            ensemblers=self.config.search.ensemblers,
            previous=previous,
            options=self.config.train,
            strategy=self.strategy,
            layout=self.layout(len(proposal.builders)),
            decay_steps=(
                self.config.search.max_iteration_steps
                if self.config.train.learning_rate_schedule == "cosine"
                else None
            ),
        )

    def restore(
        self, records: Sequence[IterationRecord], job: JobDir, *, local: bool = False
    ) -> FrozenEnsemble:
        """The last record's chosen ensemble, rebuilt from the job dir (under no strategy if
        `local`)."""
        last = records[-1]
        return self.frozen(
            self.search.members(records),
            last.architecture,
            job.frozen_prefix(last.iteration),
            local=local,
        )

    def frozen(
        self,
        builders: Sequence[Builder],
        architecture: Architecture,
        prefix: str,
        *,
        local: bool = False,
    ) -> FrozenEnsemble:
        """A finished iteration's chosen ensemble: its members (made by `builders`, as
        `Search.members` replays them) with the frozen weights read from `prefix`. Under this
        factory's strategy, or (`local`) as plain variables here.

        Raises:
            AssertionError: the checkpoint at `prefix` does not hold these members.
        """
        strategy = tf.distribute.get_strategy() if local else self.strategy
        members = []
        with strategy.scope():
            for member, builder in zip(architecture.members, builders):
                subnetwork = Subnetwork(
                    builder,
                    inputs=self.inputs,
                    logits_dimension=self.head.logits_dimension,
                    seed=self.config.training_seed,
                    name=member.key,
                    mean_of_heads=self.head.mean_of_heads,
                )
                members.append(FrozenMember(member.iteration, builder, subnetwork))
            ensembler = self.search.ensembler(architecture.ensembler)
            weights = ensembler.build(
                members=[m.as_member() for m in members],
                logits_dimension=self.head.logits_dimension,
            )
        frozen = FrozenEnsemble(tuple(members), weights, ensembler)
        frozen.checkpoint().read(
            prefix, options=None if local else self.checkpoint_options
        ).assert_existing_objects_matched()
        return frozen
