"""The progress lines of long steps (common/progress.py): create's agrees with its summary, dump's counts records."""

import io

from xlnet_data.common.progress import CountProgress, Progress


def test_creates_line_reaches_100_percent_with_the_last_unit_not_the_last_byte():
    out = io.StringIO()
    progress = Progress(total_bytes=1000, stream=out, log_every=0.0)
    progress.update(100, 5000, 0, 1000, 0, 4)  # every byte encoded, no unit done: half the work
    assert "| 50% |" in out.getvalue().splitlines()[-1]
    progress.update(100, 5000, 300, 1000, 2, 4)
    assert out.getvalue().splitlines()[-1].startswith("units 2/4 | lines 100 | encoded 5.0k tokens | records 300 |")
    assert "| 75% |" in out.getvalue().splitlines()[-1]
    progress.close(100, 5000, 600, 1000, 4, 4)  # the final counters: always shown, as the summary has them
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("units 4/4 | lines 100 | encoded 5.0k tokens | records 600 |") and "| 100% |" in last


def test_count_progress_is_silent_for_quick_work_and_counts_against_the_total():
    out = io.StringIO()
    quick = CountProgress("records", total=10, stream=out)
    for _ in range(10):
        quick.update()
    quick.close()
    assert out.getvalue() == ""
    slow = CountProgress("dump --stats: records", total=4000, stream=out, log_every=0.0)
    for _ in range(1000):
        slow.update()
    slow.close()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("dump --stats: records 1.0k of 4.0k (25%, ETA ") and "/s | " in last
