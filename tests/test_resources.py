"""create's plan before the first byte (datagen/resources.py): its estimates, and its refusals of what cannot fit,
with a small memory or disk given to the pure functions; and the machine's figures read where they are."""

import dataclasses
import os
from pathlib import Path

import pytest

from xlnet_data.datagen import resources
from xlnet_data.datagen.resources import Layout, Machine, TaskSize

MB = 1 << 20
LAYOUT = Layout(seq_len=512, reuse_len=256, bi_data=True, write_records=True, cache_bytes_per_token=2.125)


def task(number=0, mbytes=400, passes=20, in_memory=False):
    return TaskSize(number, mbytes * MB, passes, in_memory, cache_complete=False)


def machine(memory_mb=4000, disk_mb=100_000):
    return Machine(memory_mb * MB, "cgroup memory.max", disk_mb * MB, "/data")


def plan(tasks, workers=2, layout=LAYOUT, machine_=None, compile_cold=False):
    return resources.fitted(tasks, layout, 4.0, 25.0, workers, machine_ or machine(), compile_cold)


def test_the_estimates_follow_the_readme_figures():
    """400 MB of text at 4 bytes a token: 100M tokens (read as 104.9M: MB is 2**20 here); records ~25 bytes a
    token a pass with bi_data at seq_len 512 (README), the cache 2.1 bytes a token; a mapped unit's memory
    does not grow with its tokens but by its boundaries (4 bytes a line of 25 tokens)."""
    small, large = plan([task(mbytes=40)]), plan([task(mbytes=400)])
    tokens = 400 * MB / 4
    assert large.tokens == pytest.approx(tokens, rel=1e-6)
    assert large.records_disk == pytest.approx(tokens * 20 * 2 * 512 * 6.2 / 256, rel=1e-6)  # 24.8 a token a pass
    assert large.cache_disk == pytest.approx(tokens * 2.125, rel=1e-6)
    growth = (large.unit_memory - small.unit_memory) / (large.tokens - small.tokens)
    assert growth == pytest.approx(4 / 25, rel=1e-3)
    in_memory = plan([task(mbytes=400, passes=1, in_memory=True)], machine_=machine(memory_mb=100_000))
    assert in_memory.unit_memory - large.unit_memory == pytest.approx(tokens * 6.5, rel=1e-3)
    assert in_memory.cache_disk == 0  # a task encoded in memory writes no cache


def test_a_plan_that_fits_is_one_line_and_no_refusal():
    fit = plan([task(0), task(1)])
    assert resources.refusal(fit, LAYOUT, machine()) is None
    line = fit.line(machine())
    assert "\n" not in line and line.startswith("plan: 2 task(s), ~209.7M tokens (4.00 input bytes a token")
    assert "of 4.2 GB available (cgroup memory.max)" in line and "free on /data" in line
    counted = [dataclasses.replace(size, cache_complete=True, tokens=50_000_000) for size in fit.tasks]
    assert "~100.0M tokens (4.00 input bytes a token, counted in their token caches)" in plan(counted).line(machine())


def test_too_little_memory_names_the_workers_that_fit():
    """Four workers of ~256 MiB (their own 200, buffers 40, boundaries 16) and their parent's 100: 1,124 MiB; three
    and the parent fit 1,000."""
    fit = plan([task(0), task(1), task(2), task(3)], workers=4, machine_=machine(memory_mb=1000))
    why = resources.refusal(fit, LAYOUT, machine(memory_mb=1000))
    assert why == ("create would hold ~1.2 GB (4 worker(s) x ~268 MB) but 1.0 GB of memory is available "
                   "(cgroup memory.max); --num_workers=3 fits")
    assert "\n" not in why


def test_a_one_pass_task_too_large_for_memory_goes_through_its_cache_instead():
    """In memory, 100M tokens need ~0.8 GB; through the mapped cache ~0.24 GB: the plan takes the cache (the same
    records) rather than refusing."""
    tasks = [task(mbytes=400, passes=1, in_memory=True)]
    roomy = plan(tasks, workers=1, machine_=machine(memory_mb=8000))
    assert roomy.tasks[0].in_memory
    tight = plan(tasks, workers=1, machine_=machine(memory_mb=600))
    assert not tight.tasks[0].in_memory and resources.refusal(tight, LAYOUT, machine(memory_mb=600)) is None
    assert tight.cache_disk > 0


def test_memory_that_one_worker_cannot_fit_names_what_can():
    too_small = machine(memory_mb=250)  # a unit: ~256 MiB, with its boundaries
    why = resources.refusal(plan([task()], workers=1, machine_=too_small), LAYOUT, too_small)
    assert "one worker needs ~268 MB with the sentence boundaries of its task" in why and "--num_task" in why
    tiny = machine(memory_mb=150)  # less than a worker holds on any corpus
    why = resources.refusal(plan([task(mbytes=1)], workers=1, machine_=tiny), LAYOUT, tiny)
    assert why.endswith("a worker needs ~252 MB whatever the corpus (Python, the compiled loop, its buffers); give "
                        "the run more memory")
    roomy = machine(memory_mb=2000, disk_mb=400_000)
    one_file = plan([task(mbytes=2000)], workers=1, machine_=roomy)  # a file of 2 GB, encoded a block at a time
    assert one_file.encode_memory == (200 + 24) * MB and resources.refusal(one_file, LAYOUT, roomy) is None


def test_a_cold_numba_cache_counts_the_compile_and_is_named_when_it_does_not_fit():
    """A first run compiles the loops (~480 MiB a worker): counted where numba's cache is cold, and a refusal that
    only the compile causes says so; warm, the same machine fits."""
    small = machine(memory_mb=450)
    warm, cold = plan([task(mbytes=40)], workers=1, machine_=small), plan([task(mbytes=40)], workers=1,
                                                                          machine_=small, compile_cold=True)
    assert resources.refusal(warm, LAYOUT, small) is None and cold.memory == 480 * MB
    why = resources.refusal(cold, LAYOUT, small)
    assert "numba's cache is cold, and a first run compiles the loops (~503 MB)" in why and "\n" not in why
    assert "numba compiles the loops" in cold.line(machine())


def test_the_plan_corrected_once_a_task_is_encoded_says_when_the_verdict_changes():
    """Estimated at 4 bytes a token, task 0's 400 MiB counted as 200M tokens (2 bytes a token): the other task's
    tokens double too, and its records no longer fit the disk."""
    disk = machine(disk_mb=150_000)
    before = plan([task(0), task(1)], machine_=disk)
    assert resources.refusal(before, LAYOUT, disk) is None
    line, why = resources.corrected(before, LAYOUT, disk, 0, 200 * MB)
    assert "(2.00 input bytes a token, counted on task 0, 4.00 estimated; the verdict changes: it no longer fits)" \
        in line and line.startswith("plan: 2 task(s), ~419.4M tokens")
    assert why.startswith("the token cache and records would take")
    line, why = resources.corrected(before, LAYOUT, disk, 0, 100 * MB)  # as estimated: the same verdict
    assert why is None and "4.00 input bytes a token, counted on task 0, 4.00 estimated)" in line


def test_the_numba_cache_is_looked_for_where_numba_puts_it(tmp_path, monkeypatch):
    from xlnet_data.common import compiled
    monkeypatch.setattr(compiled, "CACHE_DIR", str(tmp_path))
    assert resources.compiled_cold()
    from numba.core.caching import _CacheLocator
    for path, name in resources.COMPILED:
        folder = tmp_path / _CacheLocator.get_suitable_cache_subpath(os.path.join(os.path.dirname(compiled.__file__),
                                                                                  "..", path))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{Path(path).stem}.{name}-12.py311.nbi").write_bytes(b"")
    assert not resources.compiled_cold()


def test_too_little_disk_names_nowrite_records_or_another_disk():
    tasks = [task(mbytes=400)]  # records ~52 GB, cache ~0.2 GB
    why = resources.refusal(plan(tasks), LAYOUT, machine(disk_mb=10_000))
    assert why.startswith("the token cache and records would take ~52.2 GB but /data has 10.5 GB free; "
                          "--nowrite_records fits (the token cache, ~223 MB, instead of the records")
    why = resources.refusal(plan(tasks), LAYOUT, machine(disk_mb=100))
    assert why == "the token cache and records would take ~52.2 GB but /data has 105 MB free; use a --save_dir on " \
                  "a disk with ~52.2 GB free"
    no_records = Layout(512, 256, True, write_records=False, cache_bytes_per_token=2.125)
    assert resources.refusal(plan(tasks, layout=no_records), no_records, machine(disk_mb=300)) is None
    assert resources.refusal(plan(tasks, layout=no_records), no_records, machine(disk_mb=30)).startswith(
        "the token cache would take ~223 MB but /data has 31 MB free; use a --save_dir on a disk with ~223 MB free")


def test_the_machine_is_read_from_the_cgroup_or_meminfo_and_the_nearest_existing_folder(tmp_path):
    memory, source = resources.available_memory()
    assert memory > 0 and source.startswith(("cgroup memory.", "MemAvailable"))
    free, folder = resources.free_disk(str(tmp_path / "not" / "yet"))
    assert folder == str(tmp_path) and free > 0


def test_a_first_task_of_empty_files_leaves_the_estimate():
    """Task 0 of empty files encoded (0 bytes, 0 tokens; the differential test's case84 with 200 cases divided by
    zero here): the other tasks keep the plan's 4 bytes a token."""
    before = plan([dataclasses.replace(task(0), input_bytes=0), task(1)])
    for tokens in (0, 5):
        line, why = resources.corrected(before, LAYOUT, machine(), 0, tokens)
        assert why is None and "(4.00 input bytes a token, counted on task 0, 4.00 estimated)" in line, line


def test_the_sample_measures_bytes_a_token_of_the_model(tmp_path, sample_spm):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=sample_spm)
    text = "".join(f"The quick brown fox number {i} jumps over the lazy dog.\n" for i in range(200))
    (tmp_path / "a.txt").write_text(text)
    per_token, per_line = resources.sample_bytes_per_token([str(tmp_path / "a.txt")], sp, True)
    tokens = sum(len(ids) for ids in sp.encode(text.splitlines()))
    assert per_token == pytest.approx(len(text.encode()) / tokens) and per_line == pytest.approx(tokens / 200)
    (tmp_path / "ids.txt").write_text("5 6 7\n8 9\n")
    assert resources.sample_bytes_per_token([str(tmp_path / "ids.txt")], sp, False) == (10 / 5, 2.5)
    (tmp_path / "empty.txt").write_text("")  # a line of no bytes: nothing to measure, the default
    assert resources.sample_bytes_per_token([str(tmp_path / "empty.txt")], sp, True) == (4.0, 25.0)


def test_a_run_whose_corrected_plan_no_longer_fits_stops_after_its_first_encoded_task():
    """create's on_encoded (job._correction): once, for the first task this run encodes (a found cache is not
    counted again), one line; CreateError naming the change where the count no longer fits."""
    from xlnet_data.datagen import job
    from xlnet_data.datagen.encode import EncodeResult
    from xlnet_data.datagen.plan import CreateError
    disk = machine(disk_mb=150_000)
    on_encoded = job._correction((plan([task(0), task(1)], machine_=disk), LAYOUT, disk))
    on_encoded(EncodeResult(1, encoded=False, tokens=10))  # found, not encoded: no correction
    with pytest.raises(CreateError, match=r"^the token cache and records would take .* \(corrected once task 0 was "
                                          r"encoded\); the token caches encoded so far are kept"):
        on_encoded(EncodeResult(0, encoded=True, tokens=200 * MB))
    on_encoded(EncodeResult(1, encoded=True, tokens=200 * MB))  # once only
    assert job._correction(None) is None  # Beam, or a gs:// save_dir: no plan


def test_memory_left_below_a_token_cache_is_said_in_the_line():
    """A unit draws its B anywhere in its task's cache: where the page cache left cannot hold it, the line says the
    reads go to the disk (it fits, slowly); with room, nothing is said."""
    tight = machine(memory_mb=400)
    line = plan([task(mbytes=400)], workers=1, machine_=tight).line(tight)  # cache ~223 MB, ~151 MB left
    assert line.endswith("free on /data; only ~151 MB left for the page cache of a ~223 MB token cache: its units "
                         "will read it from the disk, slowly (more memory, or a larger --num_task, keeps it cached)")
    assert "page cache" not in plan([task(mbytes=400)], workers=1).line(machine())
