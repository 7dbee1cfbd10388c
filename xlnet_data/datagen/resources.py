"""What a local `create` run will need, known before the first byte is encoded: tokens, memory and disk.

Each task's tokens are estimated from its files' bytes at the bytes a token of this model measured on the first
files (sample_bytes_per_token), or exactly where a task's token cache is complete (an earlier run's), and again
once the run has encoded its first task (corrected: its line says so, and a verdict that changes stops the run
there, the caches encoded kept for the same command to go on from); from them the memory each parallel worker
will hold (resource_plan) and the disk the token caches and the records will take, against the machine's
available memory (the cgroup's limit where there is one, else MemAvailable) and the save_dir's free disk
(machine_of). A plan that cannot fit is refused in one line naming the smallest change that does (refusal); one
that fits is one line too (ResourcePlan.line).
The functions that decide are pure: the tests give them a small memory or disk.

The figures (benchmarks/bench_create_memory.py measures a run's peak): a worker process with the compiled loop
loaded holds about WORKER_BYTES, and COMPILE_BYTES while numba compiles the loops on a first run (its on-disk cache
cold: compiled_cold); encoding a file holds a block of it (ENCODE_BUFFER_BYTES: each block is written to the
token cache as it is read); a unit that reads a mapped token cache holds its rows' sentence boundaries (4 bytes each,
about one a line) and its buffers, not its tokens; a task encoded in memory for its one unit holds its stream
(IN_MEMORY_BYTES_PER_TOKEN). Records take RECORD_BYTES_PER_POSITION a position (seq_len of them for every
reuse_len tokens of a row; twice with bi_data), the cache CACHE_BYTES_PER_TOKEN.
"""

import collections
import dataclasses
import glob
import os
from collections.abc import Sequence
from typing import Optional

import numpy as np

from xlnet_data.common import fileio, memory
from xlnet_data.dataformat import token_cache
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import Plan, size_or_zero

WORKER_BYTES = 200 << 20  # a worker's own memory: Python, numpy, SentencePiece, the compiled loop, shared libraries;
#                           create's peak RSS on 1.1M tokens (4 MB of text) was 215-255 MB, the buffers below included
PARENT_BYTES = 100 << 20  # the parent of several workers (the run itself: Python, numpy, SentencePiece)
ENCODE_BUFFER_BYTES = 24 << 20  # a block of text being encoded (corpus.READ_BLOCK_BYTES: its lines, ids, flags and
#                                  temporaries) and the cache's chunk being written; create's peak while encoding one
#                                  file of 4 MB and one of 40 MB of text: 222 and 226 MB (sampled)
COMPILE_BYTES = 480 << 20  # a worker's peak while numba compiles the loops (its cache cold): 486 MB on 2 MB of text
#                            (bench_create_memory's first run), 414 MB encoding and 480 MB in the first unit on 40 MB
COMPILED = (("dataformat/examples/loop.py", "_write_steps"), ("datagen/utf8_lines.py", "_check_utf8"))  # one a stage
IN_MEMORY_BYTES_PER_TOKEN = 6.5  # a task's stream held for its one pass: ids int32, flags, the files' chunks
BOUNDARY_BYTES = 4  # a sentence boundary of the rows: int32, held once (a reversed row reads it backwards)
UNIT_BUFFER_BYTES = 40 << 20  # a unit's records buffer (units.CHUNK_BYTES), chunks read back, mapped pages
RECORD_BYTES_PER_POSITION = 6.2  # a record's varints a position (input, target ~2 bytes each, is_masked, seg_id)
SAMPLE_BYTES = 1 << 20  # of each of the first files, encoded to measure the bytes a token
SAMPLE_FILES = 3


@dataclasses.dataclass(frozen=True)
class TaskSize:
    """A task's input as the plan sees it: bytes, and its units to run."""
    task: int
    input_bytes: int
    passes: int  # units of the task still to run
    in_memory: bool  # its one unit takes its stream from memory (no token cache)
    cache_complete: bool  # its cache is there already (not written again)
    tokens: Optional[int] = None  # counted (its complete cache's, or encoded by this run); None: estimated


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the run can use: memory (bytes, and where the figure comes from) and the save_dir's free disk."""
    memory: int
    memory_source: str  # "cgroup memory.max", "MemAvailable"...
    disk_free: int
    disk_path: str  # the existing folder the free disk was measured on


@dataclasses.dataclass(frozen=True)
class Layout:
    """The record settings the sizes depend on (create's flags of these names)."""
    seq_len: int
    reuse_len: int
    bi_data: bool
    write_records: bool
    cache_bytes_per_token: float  # token_cache: 2.125 with uint16 ids (+0.125 with word starts)


@dataclasses.dataclass(frozen=True)
class ResourcePlan:
    tasks: tuple[TaskSize, ...]
    bytes_per_token: float  # input bytes a token, measured on the sample
    tokens_per_line: float
    workers: int
    encode_memory: int  # a worker's peak while it encodes a file into a cache
    unit_memory: int  # a worker's peak while it runs a unit of the largest task (mapped, or in memory)
    cache_disk: int
    records_disk: int
    compile_memory: int = 0  # a worker's peak while numba compiles the loops (a cold cache), else 0
    largest_cache: int = 0  # the largest token cache a unit reads (its B draws anywhere in it: best in page cache)

    @property
    def worker_memory(self) -> int:
        return max(self.encode_memory, self.unit_memory, self.compile_memory)

    @property
    def tokens(self) -> int:
        return sum(self.task_tokens(task) for task in self.tasks)

    def task_tokens(self, task: TaskSize) -> int:
        return task_tokens(task, self.bytes_per_token)

    @property
    def memory(self) -> int:
        """The run's peak: `workers` workers at once, each at its larger stage, and their parent (one worker runs
        in the run's own process)."""
        return workers_memory(self.workers, self.worker_memory)

    @property
    def disk(self) -> int:
        return self.cache_disk + self.records_disk

    def line(self, machine: Machine, measured: Optional[str] = None) -> str:
        if measured is None:
            measured = ("counted in their token caches" if all(task.tokens is not None for task in self.tasks) else
                        "measured on the first files")
        in_memory = sum(task.in_memory for task in self.tasks)
        how = f", {in_memory} task(s) in memory" if in_memory else ""
        how += ", numba compiles the loops (its cache is cold)" if self.compile_memory else ""
        disk = [f"~{mb(nbytes)} of {what}" for nbytes, what in ((self.cache_disk, "token cache"),
                                                                (self.records_disk, "records")) if nbytes]
        return (f"plan: {len(self.tasks)} task(s), ~{self.tokens / 1e6:.1f}M tokens ({self.bytes_per_token:.2f} input "
                f"bytes a token, {measured}){how}; memory {self.workers} worker(s) x ~"
                f"{mb(self.worker_memory)} = ~{mb(self.memory)} of {mb(machine.memory)} "
                f"available ({machine.memory_source}); disk {' + '.join(disk) or '0 MB'} = ~{mb(self.disk)} of "
                f"{mb(machine.disk_free)} free on {machine.disk_path}{self._page_cache_note(machine)}")

    def _page_cache_note(self, machine: Machine) -> str:
        """Where the memory left is less than a task's token cache: its units' reads go to the disk (a unit draws
        its B anywhere in the cache), which fits but is slow (under a 350 MB cgroup limit, 128.8M tokens of a 274 MB
        cache: 15% of the records in 13 min; under 500 MB, from the same cache, all of them in 72 s)."""
        left = machine.memory - self.memory
        if self.largest_cache <= left:
            return ""
        return (f"; only ~{mb(max(left, 0))} left for the page cache of a ~{mb(self.largest_cache)} token cache: its "
                "units will read it from the disk, slowly (more memory, or a larger --num_task, keeps it cached)")


def task_tokens(task: TaskSize, bytes_per_token: float) -> int:
    """A task's tokens: counted where known, else its bytes at `bytes_per_token`."""
    return task.tokens if task.tokens is not None else int(task.input_bytes / bytes_per_token)


def workers_memory(workers: int, per_worker: int) -> int:
    return workers * per_worker + (PARENT_BYTES if workers > 1 else 0)


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def records_bytes_per_token(layout: Layout) -> float:
    """Records bytes a token of the stream, a pass: every reuse_len tokens of a row make a record of seq_len
    positions (two with bi_data: the row read backwards too)."""
    return (2 if layout.bi_data else 1) * layout.seq_len * RECORD_BYTES_PER_POSITION / layout.reuse_len


def resource_plan(tasks: Sequence[TaskSize], layout: Layout, bytes_per_token: float, tokens_per_line: float,
                  workers: int, compile_cold: bool = False) -> ResourcePlan:
    """The memory and disk of running `tasks` with `workers` worker processes, numba's cache cold or not (pure)."""
    tokens = {task.task: task_tokens(task, bytes_per_token) for task in tasks}
    encode_memory = WORKER_BYTES + ENCODE_BUFFER_BYTES if any(not task.cache_complete for task in tasks) else 0
    unit_memory = WORKER_BYTES + UNIT_BUFFER_BYTES
    for task in tasks:
        boundaries = tokens[task.task] / max(tokens_per_line, 1.0) * BOUNDARY_BYTES
        per_token = IN_MEMORY_BYTES_PER_TOKEN if task.in_memory else 0
        unit_memory = max(unit_memory, WORKER_BYTES + UNIT_BUFFER_BYTES + int(tokens[task.task] * per_token
                                                                              + boundaries))
    cache_disk = sum(tokens[task.task] * layout.cache_bytes_per_token for task in tasks
                     if not task.in_memory and not task.cache_complete)
    largest_cache = max((tokens[task.task] * layout.cache_bytes_per_token for task in tasks if not task.in_memory),
                        default=0)
    records_disk = (sum(tokens[task.task] * task.passes for task in tasks) * records_bytes_per_token(layout)
                    if layout.write_records else 0)
    return ResourcePlan(tuple(tasks), bytes_per_token, tokens_per_line, workers, encode_memory, unit_memory,
                        int(cache_disk), int(records_disk), COMPILE_BYTES if compile_cold else 0, int(largest_cache))


def fitted(tasks: Sequence[TaskSize], layout: Layout, bytes_per_token: float, tokens_per_line: float, workers: int,
           machine: Machine, compile_cold: bool = False) -> ResourcePlan:
    """The plan to run: tasks encoded in memory for their one unit go through their token cache instead where
    that does not fit the machine's memory (the same records, bounded memory) (pure; `refusal` says whether it
    fits)."""
    plan = resource_plan(tasks, layout, bytes_per_token, tokens_per_line, workers, compile_cold)
    if plan.memory > machine.memory and any(task.in_memory for task in tasks):
        tasks = [dataclasses.replace(task, in_memory=False) for task in tasks]
        plan = resource_plan(tasks, layout, bytes_per_token, tokens_per_line, workers, compile_cold)
    return plan


def refusal(plan: ResourcePlan, layout: Layout, machine: Machine) -> Optional[str]:
    """Why `plan` cannot run on `machine`, with the smallest change that fits, in one line; None when it fits."""
    if plan.memory > machine.memory:
        per_worker = plan.worker_memory
        fit = max((workers for workers in range(1, plan.workers) if workers_memory(workers, per_worker) <= machine.memory),
                  default=0)
        what = (f"create would hold ~{mb(plan.memory)} ({plan.workers} worker(s) x ~{mb(per_worker)}) but "
                f"{mb(machine.memory)} of memory is available ({machine.memory_source})")
        if fit >= 1:
            return f"{what}; --num_workers={fit} fits"
        if plan.compile_memory >= max(plan.encode_memory, plan.unit_memory):
            return (f"{what}: numba's cache is cold, and a first run compiles the loops (~{mb(COMPILE_BYTES)}); run "
                    "create once on a small corpus with more memory (the compiled code is then kept), or give the run "
                    "more memory")
        if WORKER_BYTES + max(UNIT_BUFFER_BYTES, ENCODE_BUFFER_BYTES) > machine.memory:
            return (f"{what}: a worker needs ~{mb(WORKER_BYTES + max(UNIT_BUFFER_BYTES, ENCODE_BUFFER_BYTES))} whatever "
                    "the corpus (Python, the compiled loop, its buffers); give the run more memory")
        return (f"{what}: one worker needs ~{mb(plan.unit_memory)} with the sentence boundaries of its task; a "
                "larger --num_task (fewer tokens a task; it changes which examples are made) fits, or more memory")
    if plan.disk > machine.disk_free:
        written = " and ".join(name for nbytes, name in ((plan.cache_disk, "token cache"), (plan.records_disk, "records"))
                               if nbytes)
        what = f"the {written} would take ~{mb(plan.disk)} but {machine.disk_path} has {mb(machine.disk_free)} free"
        no_records = plan.cache_disk + sum(plan.task_tokens(t) * layout.cache_bytes_per_token
                                           for t in plan.tasks if t.in_memory and not t.cache_complete)
        if plan.records_disk and no_records <= machine.disk_free:
            return (f"{what}; --nowrite_records fits (the token cache, ~{mb(no_records)}, instead of the records: "
                    "train_gpu and dump make the same records from it), or a --save_dir on another disk")
        return f"{what}; use a --save_dir on a disk with ~{mb(plan.disk)} free"
    return None


def available_memory() -> tuple[int, str]:
    """(bytes, where from): the tightest of the cgroup's limit less its use (v2 memory.max, v1
    memory.limit_in_bytes, of this process's cgroup and those above it) and MemAvailable, this process's own
    resident memory added back (the plan counts it: a worker, or the workers' parent)."""
    own = memory.resident_with_children()
    found = []
    meminfo = _read("/proc/meminfo")
    for line in (meminfo or "").splitlines():
        if line.startswith("MemAvailable:"):
            found.append((int(line.split()[1]) * 1024 + own, "MemAvailable"))
    for folder, limit_name, usage_name in _cgroup_folders():
        limit, usage = _read(os.path.join(folder, limit_name)), _read(os.path.join(folder, usage_name))
        if limit is None or usage is None or not limit.strip().isdigit():  # "max": no limit
            continue
        stat = dict(line.split()[:2] for line in (_read(os.path.join(folder, "memory.stat")) or "").splitlines()
                    if len(line.split()) == 2)
        # the page cache it may drop: v1 counts its children's apart (total_), v2 counts them in
        reclaimable = int(stat.get("total_inactive_file", stat.get("inactive_file", 0)))
        if int(limit) < 1 << 60:
            found.append((min(int(limit), max(0, int(limit) - int(usage) + reclaimable + own)),
                          f"cgroup {limit_name}"))
    return min(found) if found else (1 << 62, "no limit known")


def _cgroup_folders():
    """(folder, limit file, usage file) of this process's memory cgroup and each above it."""
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            root, names = "/sys/fs/cgroup", ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            root, names = "/sys/fs/cgroup/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        path = path.strip("/")
        while True:
            yield os.path.join(root, path), *names
            if not path:
                break
            path = os.path.dirname(path)


def _read(path) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def free_disk(path: str) -> tuple[int, str]:
    """(free bytes for this user, the existing folder measured) of the filesystem `path` is (or will be) on."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize, folder


def machine_of(save_dir: str) -> Optional[Machine]:
    """This machine's Machine for `save_dir`; None for a gs:// save_dir (its disk is not this machine's)."""
    if fileio.is_remote(save_dir):
        return None
    memory, source = available_memory()
    disk, folder = free_disk(save_dir)
    return Machine(memory, source, disk, folder)


def sample_bytes_per_token(files: Sequence[str], sp, from_raw_text: bool) -> tuple[float, float]:
    """(input bytes a token, tokens a line) measured on the first SAMPLE_BYTES of each of the first SAMPLE_FILES
    files: SentencePiece's ids of the lines (or, for ids input, the fields), against the bytes as stored (a
    compressed file's compressed bytes)."""
    nbytes = tokens = lines = 0
    for path in files[:SAMPLE_FILES]:
        with fileio.open_decompressed(path) as (f, raw, compression):
            data = f.read(SAMPLE_BYTES)
            text = data[:data.rfind(b"\n") + 1] or data
            nbytes += raw.tell() * len(text) // max(len(data), 1) if compression else len(text)
        sample = text.decode("utf-8", errors="replace").split("\n")[:-1] if text.endswith(b"\n") else [
            text.decode("utf-8", errors="replace")]
        lines += len(sample)
        if from_raw_text:
            tokens += sum(len(ids) or 1 for ids in sp.encode([line.strip() for line in sample]))
        else:
            tokens += sum(len(line.split()) or 1 for line in sample)
    if not nbytes:  # nothing to sample (empty files): English with XLNet's model, roughly
        return 4.0, 25.0
    return nbytes / tokens, tokens / max(lines, 1)


def cache_bytes_per_token(vocab_size: int, word_starts: bool) -> float:
    """The token cache's size a token: ids, flag bit and word-start bit (token_cache's format)."""
    return np.dtype(token_cache.id_dtype(vocab_size)).itemsize + 0.125 + (0.125 if word_starts else 0.0)


def compiled_cold() -> bool:
    """Whether numba's on-disk cache lacks a stage's compiled loop (COMPILED), so that this run compiles it: numba's
    index file where its locator puts it, looked for without importing or compiling anything."""
    from numba.core.caching import _CacheLocator

    from xlnet_data.common import compiled
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path, name in COMPILED:
        folder = os.path.join(compiled.CACHE_DIR, _CacheLocator.get_suitable_cache_subpath(os.path.join(package, path)))
        module = os.path.splitext(os.path.basename(path))[0]
        if not glob.glob(os.path.join(glob.escape(folder), f"{module}.{name}-*.nbi")):
            return True
    return False


def measured_plan(config: CreateConfig, plan: Plan, workers: int, sp, machine: Machine) -> tuple[ResourcePlan, Layout]:
    """The ResourcePlan of a create plan on `machine` (fitted), its tokens measured on the first files (counted
    where a task's cache is complete)."""
    files = [path for task in plan.tasks.values() for path in task.files]
    bytes_per_token, tokens_per_line = sample_bytes_per_token(files, sp, config.from_raw_text)
    passes = collections.Counter(unit.task for unit in plan.units)
    tasks = []
    for task in plan.tasks.values():
        found = token_cache.read_index(config.save_dir, task.task, task.cache_key)
        tasks.append(TaskSize(task.task, sum(size_or_zero(path) for path in task.files), passes[task.task],
                              task.in_memory, found is not None, None if found is None else found.tokens))
    layout = Layout(config.seq_len, config.reuse_len, config.bi_data, config.write_records,
                    cache_bytes_per_token(sp.get_piece_size(), config.word_boundaries != "spaces"))
    counted = [task for task in tasks if task.tokens]
    if counted:  # an earlier run's caches: their bytes a token, not the sample's
        bytes_per_token = sum(task.input_bytes for task in counted) / sum(task.tokens for task in counted)
    return fitted(tasks, layout, bytes_per_token, tokens_per_line, workers, machine, compiled_cold()), layout


def corrected(plan: ResourcePlan, layout: Layout, machine: Machine, task: int, tokens: int) -> tuple[str, Optional[str]]:
    """(the plan's line again, refusal or None) once `task` is encoded and its `tokens` counted: the other tasks'
    tokens at its bytes a token (pure). The line says how far the estimate was off and whether the verdict changes."""
    done = next(size for size in plan.tasks if size.task == task)
    # a task of empty files (no bytes, or no tokens) says nothing of the others: the estimate stays
    bytes_per_token = done.input_bytes / tokens if tokens and done.input_bytes else plan.bytes_per_token
    tasks = [dataclasses.replace(size, tokens=tokens) if size.task == task else size for size in plan.tasks]
    again = resource_plan(tasks, layout, bytes_per_token, plan.tokens_per_line, plan.workers,
                          bool(plan.compile_memory))
    why = refusal(again, layout, machine)
    verdict = ("; the verdict changes: it no longer fits" if why and not refusal(plan, layout, machine) else "")
    return again.line(machine, f"counted on task {task}, {plan.bytes_per_token:.2f} estimated{verdict}"), why


def with_tasks_of(plan: Plan, resources: ResourcePlan) -> Plan:
    """`plan` with the tasks that the resource plan takes through their token cache no longer in memory."""
    cached = {task.task for task in resources.tasks if not task.in_memory}
    return dataclasses.replace(plan, tasks={number: dataclasses.replace(task, in_memory=False)
                                            if number in cached else task for number, task in plan.tasks.items()})
