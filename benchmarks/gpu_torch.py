"""The PyTorch XLNet (xlnet_data.pretrain_torch) on a GPU machine as it is: python3 with torch and transformers, no
TensorFlow, no ../shared, nothing installed, under 8 minutes.

    PYTHONPATH=. python3 benchmarks/gpu_torch.py --goldens=golden_model     # a copy of ../shared/golden_model
    PYTHONPATH=. python3 benchmarks/gpu_torch.py --goldens=golden_model --smoke   # tiny shapes on the CPU

1. goldens: each model golden's two steps (memories carried) on the device in float32 (TF32 off), its TF1 checkpoint
   read by tf_checkpoint: per-token loss and memories against the stored expected.npz (tolerances of
   ../shared/README.md: 1e-5, m3_sharp's memories 5e-5).
2. recomputation: loss and every gradient with and without torch.utils.checkpoint, dropout on, the same seed.
3. speed: steps (forward, backward, Adam) at XLNet-Base (seq 512, reuse 256, mem 384, 85 predictions, bi_data) and
   XLNet-Large, bfloat16 autocast and torch.compile; Hugging Face's XLNetLMHeadModel (compiled, bf16 autocast, our
   masked loss from its logits) beside it: tokens/s and MFU (costs.train_flops, the model FLOPs of our module, over
   costs.PEAK_TFLOPS by the device's name; Hugging Face's query stream at every position is not counted).
4. fit: the largest micro-batch of XLNet-Base in bfloat16 and float32 (eager; doubling until out of memory, then
   halving the gap), with torch.cuda.max_memory_allocated; on a GPU each of our module's runs (3 and 4) also gives
   pretrain_torch/planning.py's memory plan against the allocator's peak of one step.
A table of every figure is printed last. --smoke: tiny shapes on the CPU, no compile (what the tests run).
"""

import argparse
import dataclasses
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # as PYTHONPATH=.

from bench_train import synthetic_features  # benchmarks/, the script's folder

from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import costs, hf
from xlnet_data.pretrain_torch import modeling, planning, tf_checkpoint

FEATURE_KEYS = ["input_k", "input_q", "seg_id", "perm_mask", "target", "target_mask", "target_mapping"]
STORED_ATOL = {"m3_sharp": 5e-5}  # memories of m3_sharp across CPUs (../shared/README.md); 1e-5 otherwise
# name -> (model, seq_len, reuse_len, mem_len, num_predict)
SHAPES = {
    "XLNet-Base": (C.XLNetConfig(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, ff_activation="gelu",
                                 untie_r=True, n_token=32000), 512, 256, 384, 85),
    "XLNet-Large": (C.XLNetConfig(n_layer=24, d_model=1024, n_head=16, d_head=64, d_inner=4096, ff_activation="gelu",
                                  untie_r=True, n_token=32000), 512, 256, 384, 85),
    "smoke": (C.XLNetConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, ff_activation="gelu",
                            untie_r=True, n_token=1000), 64, 32, 48, 10),
}
ROWS = []  # (section, what, figure) for the table


def report(section, what, figure):
    ROWS.append((section, what, figure))
    print(f"{section}: {what}: {figure}", flush=True)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----- 1. goldens ----------------------------------------------------------------------------------------

def goldens(directory, cases, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for case in cases:
        path = os.path.join(directory, case)
        config = C.XLNetConfig.from_json(os.path.join(path, "xlnet_config.json"))
        run = C.RunConfig.from_json(os.path.join(path, "run_config.json"))
        model = modeling.XLNet(config, run).eval()
        tf_checkpoint.load_original(model, os.path.join(path, "model.ckpt"))
        model.to(device)
        features, expected = np.load(os.path.join(path, "features.npz")), np.load(os.path.join(path, "expected.npz"))
        mems = [torch.from_numpy(features[f"mems_in_0_{layer}"]).to(device) for layer in range(config.n_layer)]
        worst_loss = worst_mems = 0.0
        with torch.no_grad():
            for step in range(2):
                batch = {key: torch.from_numpy(features[f"{key}_{step}"]).to(device) for key in FEATURE_KEYS}
                out = model(batch, mems)
                worst_loss = max(worst_loss, float(np.abs(out.token_loss.cpu().numpy()
                                                          - expected[f"token_loss_{step}"]).max()))
                worst_mems = max(worst_mems, max(float(np.abs(mem.cpu().numpy() - expected[f"new_mems_{step}_{layer}"])
                                                       .max()) for layer, mem in enumerate(out.new_mems)))
                mems = out.new_mems
        atol = STORED_ATOL.get(case, 1e-5)
        verdict = "PASS" if worst_loss <= atol and worst_mems <= atol else "FAIL"
        report("goldens", case, f"{verdict} (per-token loss {worst_loss:.1e}, memories {worst_mems:.1e}; "
                                f"tolerance {atol:g})")


# ----- 2. recomputation ----------------------------------------------------------------------------------

def random_batch(bsz, seq_len, num_predict, n_token, device, seed):
    """bench_train's synthetic batch (the input pipeline's shapes and dtypes, random content) on the device."""
    features = synthetic_features(bsz, seq_len, num_predict, n_token, seed)
    return {key: torch.from_numpy(features[key]).to(device) for key in FEATURE_KEYS}


def recomputation(shape_name, device):
    model_config, seq_len, reuse_len, mem_len, num_predict = SHAPES[shape_name]
    model_config = dataclasses.replace(model_config, n_layer=min(model_config.n_layer, 4))
    run = C.RunConfig(mem_len=mem_len, reuse_len=reuse_len, bi_data=True, dropout=0.1, dropatt=0.1)
    batch = random_batch(4, seq_len, num_predict, model_config.n_token, device, 1)
    results = []
    for recompute in (False, True):
        model = modeling.XLNet(model_config, run, recompute=recompute)
        modeling.init_weights(model, run, torch.Generator().manual_seed(0))
        model.to(device).train()
        torch.manual_seed(2)
        out = model(batch, model.initial_mems(4, device))
        out.loss.backward()
        results.append((out.loss.item(), {name: p.grad for name, p in model.named_parameters()}))
    (loss, grads), (loss_r, grads_r) = results
    loss_diff = abs(loss_r - loss) / abs(loss)
    grad_diff = max(float((grads_r[name] - grad).norm() / grad.norm()) for name, grad in grads.items())
    verdict = "PASS" if loss_diff <= 1e-6 and grad_diff <= 1e-6 else "FAIL"
    report("recomputation", f"{shape_name} ({model_config.n_layer} layers, dropout 0.1)",
           f"{verdict} (loss {loss_diff:.1e} relative, gradients {grad_diff:.1e} of their norm)")


# ----- 3. speed, 4. fit ------------------------------------------------------------------------------------

class HFStep(torch.nn.Module):
    """Hugging Face's XLNetLMHeadModel on our features, with our masked loss (its labels= counts padding slots)."""

    def __init__(self, model_config, run):
        super().__init__()
        import transformers
        settings = {**hf.hf_config(model_config, run), "use_mems_train": True}
        self.model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**settings))
        self.run = run

    def forward(self, batch, mems):
        out = self.model(input_ids=batch["input_k"].long(), token_type_ids=batch["seg_id"].long(),
                         perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"], mems=mems,
                         use_mems=True)
        token_loss = F.cross_entropy(out.logits.float().flatten(0, 1), batch["target"].long().flatten(),
                                     reduction="none").view(batch["target"].shape)
        mask = batch["target_mask"]
        return (token_loss * mask).sum() / mask.sum(), out.mems


def step_shape(shape_name, bsz, bfloat16, recompute=False):
    _, seq_len, reuse_len, mem_len, num_predict = SHAPES[shape_name]
    return costs.StepShape(seq_len=seq_len, reuse_len=reuse_len, mem_len=mem_len, bsz_per_replica=bsz,
                           num_predict=num_predict, bi_data=True, recompute=recompute, bfloat16=bfloat16)


def time_steps(impl, shape_name, bsz, device, bfloat16, compile_, steps, warmup, recompute=False):
    """(median seconds of a training step (forward, backward, Adam), torch.cuda.max_memory_allocated over the run,
    the last loss, and for our module on a GPU the plan of pretrain_torch/planning.py against the allocator's peak
    of one more step (its AllocatorCheck.row), else "")."""
    model_config, seq_len, reuse_len, mem_len, num_predict = SHAPES[shape_name]
    run = C.RunConfig(mem_len=mem_len, reuse_len=reuse_len, bi_data=True)
    if impl == "ours":
        model = modeling.XLNet(model_config, run, recompute=recompute)
        modeling.init_weights(model, run, torch.Generator().manual_seed(0))
        model.to(device).train()

        def forward(batch, mems):
            out = model(batch, mems)
            return out.loss, out.new_mems
        mems = model.initial_mems(bsz, device)
    else:
        model = HFStep(model_config, run).to(device).train()
        forward, mems = model, [torch.zeros(mem_len, bsz, model_config.d_model, device=device)
                                for _ in range(model_config.n_layer)]
    if compile_:
        forward = torch.compile(forward)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-8)
    batch = random_batch(bsz, seq_len, num_predict, model_config.n_token, device, 0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    state = {"mems": mems}

    def one_step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bfloat16):
            loss, new_mems = forward(batch, state["mems"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["mems"], state["loss"] = [mem.detach() for mem in new_mems], loss.detach()

    times = []
    for step in range(warmup + steps):
        synchronize(device)
        tic = time.perf_counter()
        one_step()
        synchronize(device)
        if step >= warmup:
            times.append(time.perf_counter() - tic)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    plan = ""
    if impl == "ours" and device.type == "cuda":
        shape = step_shape(shape_name, bsz, bfloat16, recompute)
        plan = planning.allocator_check(model_config, shape, one_step, device).row()
    return float(np.median(times)), peak, state["loss"].item(), plan


def speed(shape_name, bsz, device, peak_tflops, compile_, steps, warmup):
    model_config, seq_len, reuse_len, mem_len, num_predict = SHAPES[shape_name]
    flops = costs.train_flops(model_config, step_shape(shape_name, bsz, bfloat16=True))
    for impl, name in (("ours", "pretrain_torch XLNet"), ("hf", "Hugging Face XLNetLMHeadModel")):
        try:
            seconds, peak, loss, plan = time_steps(impl, shape_name, bsz, device, True, compile_, steps, warmup)
        except torch.cuda.OutOfMemoryError:
            report("speed", f"{shape_name} {name}, {bsz} rows, bf16", "out of memory")
            torch.cuda.empty_cache()
            continue
        mfu = f", MFU {100 * flops / seconds / 1e12 / peak_tflops:.1f}%" if peak_tflops else ""
        report("speed", f"{shape_name} {name}, {bsz} rows, bf16{', compiled' if compile_ else ''}",
               f"{1000 * seconds:.1f} ms/step, {bsz * seq_len / seconds:,.0f} tokens/s{mfu}, "
               f"peak {peak / 2**30:.1f} GiB, loss {loss:.2f}{'; memory ' + plan if plan else ''}")


def fits(shape_name, bsz, device, bfloat16):
    """time_steps' figures of two eager steps of our module (and the allocator check), None when out of memory."""
    try:
        return time_steps("ours", shape_name, bsz, device, bfloat16, False, steps=1, warmup=1)
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def largest_batch(shape_name, device, bfloat16, most):
    """The largest even micro-batch (bi_data) that trains, up to `most`: doubling, then halving the gap."""
    low, low_result, high = 0, None, None
    bsz = 2
    while bsz <= most:
        result = fits(shape_name, bsz, device, bfloat16)
        if result is None:
            high = bsz
            break
        low, low_result, bsz = bsz, result, bsz * 2
    while high is not None and high - low > 2:
        middle = (low + high) // 4 * 2
        result = fits(shape_name, middle, device, bfloat16)
        if result is None:
            high = middle
        else:
            low, low_result = middle, result
    what = f"{shape_name} largest micro-batch, {'bf16' if bfloat16 else 'float32'}, eager"
    if low_result is None:
        report("fit", what, "not even 2 rows")
        return
    _, peak, _, plan = low_result
    report("fit", what, f"{low} rows{' (the cap)' if high is None else ''}, max_memory_allocated "
                        f"{peak / 2**30:.1f} GiB{'; memory ' + plan if plan else ''}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goldens", required=True, help="a folder of the model goldens (../shared/golden_model)")
    parser.add_argument("--cases", default="m1_bi_untied,m2_uni_tied,m3_sharp", help="the goldens to run")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, no compile")
    parser.add_argument("--parts", default="goldens,recomputation,speed,fit", help="which parts, comma-separated")
    parser.add_argument("--bsz", type=int, default=8, help="rows per step of the speed part (even: bi_data)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps of the speed part")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiling, autotuning)")
    parser.add_argument("--max_bsz", type=int, default=256, help="the fit part's cap")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    peak_tflops = costs.peak_tflops(name, bfloat16=True)
    print(f"{name}; torch {torch.__version__}; peak {peak_tflops or 'unknown'} TFLOP/s bf16", flush=True)
    parts = args.parts.split(",")
    start = time.perf_counter()
    if "goldens" in parts:
        goldens(args.goldens, args.cases.split(","), device)
    shapes = ["smoke"] if args.smoke else ["XLNet-Base", "XLNet-Large"]
    if "recomputation" in parts:
        recomputation(shapes[0], device)
    torch.backends.cuda.matmul.allow_tf32 = True  # float32 in the fit part: as a user would train
    if "speed" in parts:
        for shape_name in shapes:
            speed(shape_name, args.bsz, device, peak_tflops, not args.smoke, args.steps, args.warmup)
    if "fit" in parts:
        for bfloat16 in (True, False):
            largest_batch(shapes[0], device, bfloat16, 2 if args.smoke else args.max_bsz)
    print(f"\n{name}, {time.perf_counter() - start:.0f} s:")
    width = max(len(f"{section}: {what}") for section, what, _ in ROWS)
    for section, what, figure in ROWS:
        print(f"  {f'{section}: {what}':{width}s}  {figure}")


if __name__ == "__main__":
    main()
