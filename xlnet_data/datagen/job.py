"""A whole `create` run as one call: check and plan, write corpus_info.json, run the units, sum them up."""

import dataclasses
from collections.abc import Sequence
from typing import Optional

from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import make_plan, prepare_save_dir
from xlnet_data.datagen.units import UnitResult


@dataclasses.dataclass(frozen=True)
class CreateSummary:
    """What a run wrote, over its units (units skipped as complete already are not counted)."""

    units: tuple[UnitResult, ...]

    @property
    def written(self) -> list[UnitResult]:
        return [r for r in self.units if not r.skipped]

    def total(self, field: str, written_only: bool = True) -> int:
        return sum(getattr(r, field) for r in (self.written if written_only else self.units))

    def line(self, seconds: float) -> str:
        return (f"done: {len(self.written)} unit(s), {self.total('tokens')} tokens, {self.total('records')} records "
                f"in {self.total('num_batch')} batches, {self.total('dropped_tokens')} tail tokens dropped, "
                f"{self.total('invalid_utf8_lines', False)} invalid UTF-8 lines replaced, "
                f"{self.total('skipped_files', False)} files without tokens skipped, {seconds:.1f} s")


def create_records(config: CreateConfig, *, overwrite: bool = False, num_workers: Optional[int] = None,
                   beam_args: Optional[Sequence[str]] = None) -> CreateSummary:
    """Makes the records of `config` (a validated CreateConfig) in config.save_dir; returns the summary.
    Local paths in it are made absolute first (corpus_info.json records them so).

    Units already complete are skipped unless `overwrite`. Runs on local worker processes
    (`num_workers`, default: the CPU count), or as an Apache Beam pipeline with options `beam_args`
    (beam_runner.pipeline_args makes and checks them, e.g. ["--runner=DirectRunner"]). Raises
    ConfigError, CreateError, InputError or VocabError with a one-line message, before anything is
    written where it can.
    """
    # Absolute before the plan lists the files: a Beam or cluster worker has another working directory.
    config = config.with_absolute_paths()
    plan = make_plan(config, overwrite)
    prepare_save_dir(config, plan)
    if beam_args is not None:
        from xlnet_data.datagen.beam_runner import run_beam
        results = run_beam(config, plan, beam_args)
    else:
        from xlnet_data.datagen.local_runner import run_local
        results = run_local(config, plan, num_workers=num_workers)
    return CreateSummary(tuple(results))
