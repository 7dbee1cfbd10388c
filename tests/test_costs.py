"""What a step costs (xlnet_data.pretrain.costs, reporting): the parameter count is the model's, the FLOPs a hand
count's, the plan shrinks with K, recomputation and bfloat16 and names the smallest change that fits, the log
line's rates. Through train_gpu (test_train.py, on its records): a run that cannot fit --device_memory is refused
in one line before any step, --dry_run writes nothing and projects the run. The estimate against measured peaks
is benchmarks/bench_memory.py's (BENCHMARKS.md)."""

import dataclasses
import logging
import re

import numpy as np
import pytest

from xlnet_data.common.errors import ConfigError
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import costs


@pytest.mark.parametrize("untie_r", [True, False])
def test_the_parameter_count_is_the_models(untie_r):
    from xlnet_data.pretrain import modeling as M

    config = C.XLNetConfig(n_layer=3, d_model=24, n_head=3, d_head=5, d_inner=40, untie_r=untie_r, n_token=101)
    model = M.build_model(config, C.RunConfig())
    assert costs.param_count(config) == sum(int(np.prod(v.shape)) for v in model.weights.values())
    # XLNet-Base (cased): 116.7 million, as released.
    base = C.XLNetConfig(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, untie_r=True, n_token=32000)
    assert costs.param_count(base) == sum(int(np.prod(s)) for s in M.variable_shapes(base).values()) == 116_750_336


def test_the_flops_are_a_hand_count():
    """One layer, d_model 4, 2 heads of 3 (6), d_inner 5, 7 tokens; seq_len 4, mem_len 2 (6 keys, 10 relative
    positions), 2 predictions, 2 rows, bi_data. Every matmul of the forward pass as (m, k, n), per row."""
    model = C.XLNetConfig(n_layer=1, d_model=4, n_head=2, d_head=3, d_inner=5, n_token=7)
    shape = costs.StepShape(seq_len=4, reuse_len=2, mem_len=2, bsz_per_replica=2, num_predict=2, bi_data=True)
    content = [(4, 4, 6), (6, 4, 6), (6, 4, 6),  # q over the sequence; k, v over memory + sequence
               (4, 6, 6), (4, 6, 10), (4, 6, 2), (4, 6, 6),  # vs keys, vs relative positions, segment, values
               (4, 6, 4), (4, 4, 5), (4, 5, 4)]  # o, the feed-forward pair
    query = [(2, 4, 6), (2, 6, 6), (2, 6, 10), (2, 6, 2), (2, 6, 6), (2, 6, 4), (2, 4, 5), (2, 5, 4)]
    head = [(2, 4, 7)]
    positions = [(10 * 2, 4, 6)]  # once per batch: 10 positions x 2 directions
    macs = 2 * sum(m * k * n for m, k, n in content + query + head) + sum(m * k * n for m, k, n in positions)
    assert macs == 2 * (1216 + 464 + 56) + 480
    assert costs.train_flops(model, shape) == 3 * 2 * macs == 23712
    # Two micro-batches project the positions twice; two replicas do everything twice.
    assert costs.train_flops(model, dataclasses.replace(shape, micro_batches=2)) == 3 * 2 * (macs + 480)
    assert costs.train_flops(model, dataclasses.replace(shape, replicas=2)) == 2 * 23712
    assert costs.tokens_per_step(dataclasses.replace(shape, replicas=2)) == 16


def test_the_plan_shrinks_with_k_recomputation_and_bfloat16():
    base = C.XLNetConfig(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, ff_activation="gelu",
                         untie_r=True, n_token=32000)
    shape = costs.StepShape(seq_len=512, reuse_len=256, mem_len=384, bsz_per_replica=8, num_predict=85, bi_data=True)
    plan = costs.memory_plan(base, shape)
    assert plan.weights == plan.gradients == 4 * 116_750_336 and plan.adam == 8 * 116_750_336
    smaller = [costs.memory_plan(base, dataclasses.replace(shape, **change)).activations
               for change in ({"micro_batches": 2}, {"micro_batches": 4}, {"recompute": True}, {"bfloat16": True})]
    assert plan.activations > smaller[0] > smaller[1] and smaller[2] < plan.activations / 3
    assert smaller[3] < plan.activations
    # 5 GB: K=2 alone does not fit this batch of 8, K=4 does; it is named first, before --recompute.
    line = pytest.raises(costs.DoesNotFitError, costs.check_fits, base, shape, 5 * costs.GIB, "a GPU").value
    assert re.fullmatch(r"this run needs an estimated [\d.]+ GB per replica, a GPU has 5.00 GB: it fits with "
                        r"--gradient_accumulation_steps=\d \(estimated [\d.]+ GB\)", str(line)), line
    k = int(re.search(r"steps=(\d)", str(line))[1])
    assert costs.memory_plan(base, dataclasses.replace(shape, micro_batches=k)).total <= 5 * costs.GIB
    assert costs.memory_plan(base, dataclasses.replace(shape, micro_batches=k // 2)).total > 5 * costs.GIB
    with pytest.raises(costs.DoesNotFitError, match="nothing fits: weights, gradients and Adam's slots alone"):
        costs.check_fits(base, shape, costs.GIB, "--device_memory")


@pytest.mark.parametrize("text, value", [("16GB", 16 << 30), ("80 GiB", 80 << 30), ("512M", 512 << 20),
                                         ("1.5TB", int(1.5 * (1 << 40))), ("1000", 1000),
                                         ("off", 0)])
def test_device_memory_sizes(text, value):
    assert costs.parse_bytes(text) == value


def test_a_bad_device_memory_is_refused():
    with pytest.raises(ConfigError, match="--device_memory='16 gigs': give a size such as 16GB"):
        costs.parse_bytes("16 gigs")


@pytest.mark.parametrize("text", ["0GB", "0", "0.0 GiB", "0.4"])
def test_a_device_memory_of_no_bytes_is_refused_not_taken_for_off(text):
    """Issue 43: --device_memory=0GB turned the check off unsaid; `off` is the one way to."""
    with pytest.raises(ConfigError, match=rf"^--device_memory={text!r}: .*off"):
        costs.parse_bytes(text)


def test_known_gpus_peaks_by_name():
    assert costs.peak_tflops("NVIDIA A100-SXM4-80GB", bfloat16=True) == 312.0
    assert costs.peak_tflops("NVIDIA A10", bfloat16=False) == 31.2
    assert costs.peak_tflops("NVIDIA H100 PCIe", bfloat16=True) == 756.0
    assert costs.peak_tflops("NVIDIA L40S", bfloat16=True) == 362.0
    assert costs.peak_tflops("AMD EPYC", bfloat16=False) is None


def test_the_log_line_adds_the_rates_after_the_originals_fields(caplog):
    import tensorflow as tf

    from xlnet_data.pretrain import reporting
    with_peak = costs.StepCost(flops=2e12, tokens=1024, sequences=2, peak_flops=100e12)
    writer = tf.summary.create_noop_writer()
    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        reporting.report(10, [2.0] * 10, 0.5, 1e-4, 4.0, with_peak, 900, writer)
        reporting.report(10, [2.0] * 10, 0.5, 1e-4, 4.0, dataclasses.replace(with_peak, peak_flops=None), 900, writer)
    assert caplog.messages == [
        "step 10 | loss 2.0000 | pplx 7.39 | bpt 2.8854 | gnorm 0.500 | lr 1.000e-04 | 2560 tok/s | 5.00 seq/s | "
        "5 TFLOP/s | MFU 5.0% | 6m00s left",
        "step 10 | loss 2.0000 | pplx 7.39 | bpt 2.8854 | gnorm 0.500 | lr 1.000e-04 | 2560 tok/s | 5.00 seq/s | "
        "5 TFLOP/s | 6m00s left"]
