"""benchmarks/gpu_torch.py, which runs on the GPU machines as they are (issue 47's table), checked here with --smoke
(tiny shapes, the CPU, no compiling) so that it cannot rot: every part reports, its checks pass, the table comes
last."""

import subprocess
import sys

import pytest
from conftest import ROOT, SHARED, needs_shared


@pytest.mark.slow
@needs_shared
def test_the_gpu_script_runs_on_the_cpu_with_smoke_shapes():
    # One OpenMP thread: with two, each tiny op's threads wait on the machine's other processes (71 s against
    # 20 s measured on the shared 2-core machine)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "benchmarks/gpu_torch.py", "--smoke", f"--goldens={SHARED / 'golden_model'}",
                             "--cases=m2_uni_tied", "--steps=1", "--warmup=0", "--bsz=4"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line.strip() for line in result.stdout.split("\nCPU, ")[-1].splitlines()[1:]]
    parts = [line.split(":")[0] for line in table]
    assert parts == ["floors"] * 2 + ["goldens"] * 2 + ["flex"] * 2 + ["accumulation"] * 2 + ["recomputation"] + \
        ["features"] * 2 + ["speed"] * 6 + ["profile"] + ["fit"] * 2, "\n".join(table)
    checks = [line for line in table if line.split(":")[0] in ("goldens", "flex", "accumulation", "recomputation")]
    assert all("PASS" in line for line in checks) and "PASS" in table[9], "\n".join(table)
    assert "goldens: m2_uni_tied, eager" in table[2] and "goldens: m2_uni_tied, flex" in table[3]
    speed = table[11:17]
    assert [("flex" in line, "fused Adam" in line, "trainer's Adam" in line) for line in speed[:4]] == [
        (False, False, False), (True, False, False), (True, True, False), (True, False, True)]
    assert all("tokens/s" in line and "floors: matmul" in line for line in speed[:5])
    assert "Hugging Face" in speed[4] and "against Hugging Face's" in speed[5]
    assert "profile: smoke" in result.stdout and "Self CPU time total" in result.stdout
