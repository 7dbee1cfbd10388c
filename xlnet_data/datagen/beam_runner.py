"""The Beam runner: a plan's units as the elements of an Apache Beam pipeline (Direct, Dataflow, Flink, Spark).

Two stages, as the local runner, both as the plan says: each task with units to run is one element of the
encode stage. A task the plan encodes in memory (TaskPlan.in_memory: its one unit to run) is encoded and its
unit run in that element, with no token cache; another is encoded into its token cache in save_dir
(`encode.encode_task`) and its (task, pass) units emitted, each one element. Units run by the same
`units.run_unit` as the local runner's and are written to the same file names. Outputs are atomic and a unit's
record_info is written last, so a retried element rewrites identical files, and a re-run of a failed pipeline
skips the complete units (make_plan does). The summary's counts of a complete unit are read back from its
record_info, where run_unit stores them; a unit that wrote nothing has only the workers' Beam metrics (one
counter per unit and field), which some runners (DaskRunner) do not collect. Apache Beam is an optional extra,
imported only here and only when used.
"""

import importlib.util
import logging
import shlex

from xlnet_data.dataformat import record_info
from xlnet_data.dataformat.vocab import load_sentencepiece
from xlnet_data.datagen import encode, units
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import CreateError, Plan, unit_is_complete

log = logging.getLogger("xlnet_data")

INSTALL_HINT = "--runner=beam needs Apache Beam: pip install 'xlnet-data[beam]'"
DASK_INSTALL_HINT = "--beam_runner=DaskRunner needs Dask: pip install 'xlnet-data[beam,dask]'"
_NAMESPACE = "xlnet_data"
# Runners Beam knows only by their module path; their short names are accepted too.
RUNNER_PATHS = {"DaskRunner": "apache_beam.runners.dask.dask_runner.DaskRunner"}
_DASK_PARTITIONING = ("--dask_npartitions", "--dask_partition_size")


def _import_beam():
    try:
        import apache_beam
    except ImportError:
        raise CreateError(INSTALL_HINT) from None
    return apache_beam


def runner_path(runner):
    """The name Beam resolves for --beam_runner=`runner`: a short name it does not know mapped to the path."""
    return RUNNER_PATHS.get(runner, runner)


def pipeline_args(runner, options=""):
    """Beam's arguments for --beam_runner and --beam_options, checked before anything is written: Beam is
    installed, the options split, the runner exists and has the options it requires (Dataflow: --project, ...)."""
    beam = _import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions
    try:
        args = [f"--runner={runner_path(runner)}", *shlex.split(options)]
        if runner_path(runner) == RUNNER_PATHS["DaskRunner"]:
            args += _dask_args(args)
        beam.Pipeline(options=PipelineOptions(args))  # makes the runner and validates the options for it
    except (ValueError, ImportError) as err:
        problems = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        raise CreateError(f"--beam_runner={runner} --beam_options={options!r}: {problems}") from None
    return args


def _dask_args(args):
    """What DaskRunner needs beyond the user's options: one unit per Dask task (its default packs up to 128
    elements into one task, which one worker would then run alone)."""
    if importlib.util.find_spec("distributed") is None:  # Beam's DaskRunner fails obscurely without it
        raise CreateError(DASK_INSTALL_HINT)
    return [] if any(arg.startswith(_DASK_PARTITIONING) for arg in args) else ["--dask_partition_size=1"]


def _metric(unit, field):
    return f"task{unit.task}-pass{unit.pass_id}.{field}"


def _unit_runner(beam, config, plan):
    """A DoFn base: the SentencePiece model loaded once per worker, and a unit run with its counts reported as
    Beam metrics."""
    from apache_beam.metrics import Metrics

    class UnitRunner(beam.DoFn):
        def setup(self):
            self.sp = load_sentencepiece(config.sp_path)

        def run_unit(self, unit, encoded=None):
            task = plan.tasks[unit.task]
            result = units.run_unit(config, unit, task.cache_key, self.sp, encoded=encoded, made_from=task.made_from)
            if result.skipped:
                log.warning("task %d pass %d: %s", unit.task, unit.pass_id, result.skipped)
            for field in record_info.COUNTS:
                Metrics.counter(_NAMESPACE, _metric(unit, field)).inc(getattr(result, field))
            log.info("task %d pass %d: %d records written", unit.task, unit.pass_id, result.records)

    return UnitRunner


def _encode_task_fn(beam, config, plan):
    """A DoFn running the encode stage of one task element: a task the plan encodes in memory is encoded and
    its one unit run here, in this element (no token cache); another is encoded into its token cache, then its
    units are emitted, so that its passes start once the cache is complete."""

    class EncodeTask(_unit_runner(beam, config, plan)):
        def process(self, number):
            task = plan.tasks[number]
            settings = encode.EncodeSettings.of(config)
            if task.in_memory:
                unit, = (unit for unit in plan.units if unit.task == number)
                self.run_unit(unit, encode.encode_in_memory(settings, number, task.files, self.sp))
                return
            encode.encode_task(config.save_dir, settings, number, task.files, task.cache_key, self.sp)
            yield from (unit for unit in plan.units if unit.task == number)

    return EncodeTask()


def _run_unit_fn(beam, config, plan):
    """A DoFn running one unit element, from its task's token cache."""

    class RunUnit(_unit_runner(beam, config, plan)):
        def process(self, unit):
            self.run_unit(unit)

    return RunUnit()


def _worker_counters(outcome):
    """{metric name: value} of the workers' counters, or None from a runner without metrics (DaskRunner)."""
    from apache_beam.metrics.metric import MetricsFilter
    try:
        query = outcome.metrics().query(MetricsFilter().with_namespace(_NAMESPACE))
    except NotImplementedError:
        return None
    return {m.key.metric.name: m.result for m in query["counters"]}


def _results(config, todo, counters):
    """UnitResults: a complete unit's from its record_info (exact whatever the runner, retries included), the
    others' from the workers' counters (none from a runner without metrics: DaskRunner)."""
    results = []
    for unit in todo:
        if unit_is_complete(config, unit):
            results.append(units.recorded_result(unit, *config.unit_paths(unit)))
            continue
        result = units.UnitResult(unit, **{field: (counters or {}).get(_metric(unit, field), 0)
                                           for field in record_info.COUNTS})
        result.skipped = "nothing written: too few tokens for one batch (see the workers' log)"
        results.append(result)
    return results


def run_beam(config: CreateConfig, plan: Plan, beam_args):
    """Runs the plan's units as a Beam pipeline with options `beam_args` (e.g. ["--runner=DataflowRunner",
    "--project=..."]); waits for it and returns their UnitResults."""
    if not plan.units:
        return []
    beam = _import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions

    p = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    _ = (p
         | "Tasks" >> beam.Create(sorted(plan.tasks))
         | "SpreadTasks" >> beam.Reshuffle()  # no fusion with Create: the tasks go to different workers
         | "EncodeTask" >> beam.ParDo(_encode_task_fn(beam, config, plan))
         | "Spread" >> beam.Reshuffle()  # nor with the encode stage: a task's passes go to different workers
         | "RunUnit" >> beam.ParDo(_run_unit_fn(beam, config, plan)))
    try:
        outcome = p.run()
        outcome.wait_until_finish()
    except Exception as err:  # the runner's own error, often a worker's traceback as text
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CreateError(f"the Beam pipeline failed: {first_line}; the units it completed are kept, "
                          "run the same command again to do the rest") from err
    return _results(config, plan.units, _worker_counters(outcome))
