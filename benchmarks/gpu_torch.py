"""The PyTorch XLNet (xlnet_data.pretrain_torch) on a GPU machine as it is, issue 47's table in one call under 8 minutes.

Needs: python3 (3.12), torch (2.11), transformers (5.17), numpy, sentencepiece, absl-py, triton (the GPU image's);
nothing installed, no TensorFlow, no ../shared: the model goldens travel in the git-ignored folder gpu_carry/ (made
here with `mkdir -p gpu_carry && cp -r ../shared/golden_model gpu_carry/`, carried with the device tool's
carry=["gpu_carry"]):

    PYTHONPATH=. python3 benchmarks/gpu_torch.py --goldens=gpu_carry/golden_model          # the GPU, < 8 minutes
    PYTHONPATH=. python3 benchmarks/gpu_torch.py --goldens=gpu_carry/golden_model --smoke  # tiny shapes on the CPU

Parts (--parts; each row of the table names its part), in this order, each skipped once --budget_s is spent:
1. floors: a measured bfloat16 matmul rate (8192 cubed) and device copy rate (1 GiB, read + written): the step's
   two floors are its FLOPs over the first and its bytes over the second.
2. goldens: each model golden's two steps (memories carried) in float32 (TF32 off), eager and flex (FlexAttention,
   compiled): per-token loss and memories against expected.npz (tolerances of ../shared/README.md).
3. flex: the fused attention against the eager module on the device, forward and backward (the CPU tests' check,
   here on the compiled kernel): float32 within 1e-5 relative, bfloat16 within 1e-2 (outputs; the whole gradient).
4. accumulation: K = 2 and 4 micro-batches against K = 1 (loss, every gradient), float32.
5. recomputation: loss and every gradient with and without torch.utils.checkpoint, dropout on, the same seed.
6. features: perm_mask and target_mapping made on the device (device_features.expand) equal to the host's, the
   time of that and of the host-to-device copy of what the host ships against the copy of host-made features.
7. speed: steps (forward, backward, clipping, Adam) at XLNet-Base (seq 512, reuse 256, mem 384, 85 predictions,
   bi_data, bfloat16 autocast) for each variant: eager; compiled (torch.compile); compiled + flex; + fused Adam
   (torch.optim.Adam's; the others torch's foreach Adam); + the trainer's own Adam and clipping (optim.py, foreach);
   + CUDA graphs (compile mode reduce-overhead); Hugging Face's XLNetLMHeadModel compiled beside it; then at
   XLNet-Large the fastest of ours and Hugging Face's: ms/step, tokens/s, MFU (costs.train_flops, our module's model
   FLOPs, over the peak of costs.PEAK_TFLOPS by the device's name: 989 TFLOP/s for an H100 SXM or H200; Hugging
   Face's query stream at every position is not counted) and the step's two floors (its FLOPs at the measured matmul
   rate; twice the bytes of its planned peak, pretrain_torch/planning.py's, at the measured copy rate).
8. profile: torch.profiler's table (top operators by device time) of 3 steps of the fastest variant at XLNet-Base.
9. fit: the largest micro-batch of XLNet-Base in bfloat16 and float32 (eager; doubling until out of memory, then
   halving the gap) with torch.cuda.max_memory_allocated and pretrain_torch/planning.py's plan beside it.
A table of every figure is printed last. --smoke: tiny shapes on the CPU, no compile, no CUDA graphs; torch's
refusal of FlexAttention's backward on the CPU is lifted there (its reference backward runs, as in the tests).
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
from xlnet_data.pretrain_torch import device_features, examples, modeling, planning, tf_checkpoint
from xlnet_data.pretrain_torch.accumulation import forward_backward
from xlnet_data.pretrain_torch.optim import AdamWeightDecay, clip_by_global_norm

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


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of running our step: torch.compile, the attention, Adam's kernel, CUDA graphs."""
    name: str
    compile: bool = False
    attention: str = "eager"
    fused_adam: bool = False  # torch.optim.Adam(fused=True); else its default (foreach)
    trainer_adam: bool = False  # the trainer's own optimiser (optim.py: the original's Adam, foreach) and clipping
    cuda_graphs: bool = False  # torch.compile(mode="reduce-overhead"): the step's kernels replayed as CUDA graphs


VARIANTS = [Variant("eager"), Variant("compiled", compile=True),
            Variant("compiled + flex", compile=True, attention="flex"),
            Variant("compiled + flex + fused Adam", compile=True, attention="flex", fused_adam=True),
            Variant("compiled + flex + the trainer's Adam", compile=True, attention="flex", trainer_adam=True),
            Variant("compiled + flex + fused Adam + CUDA graphs", compile=True, attention="flex", fused_adam=True,
                    cuda_graphs=True)]
ROWS = []  # (section, what, figure) for the table
FLOORS = {}  # "matmul": FLOP/s, "copy": bytes/s, measured


def report(section, what, figure):
    ROWS.append((section, what, figure))
    print(f"{section}: {what}: {figure}", flush=True)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def verdict(ok):
    return "PASS" if ok else "FAIL"


# ----- 1. floors -----------------------------------------------------------------------------------------

def floors(device, smoke):
    """The measured bfloat16 matmul rate and device copy rate."""
    n = 256 if smoke else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    seconds = timed(lambda: torch.matmul(a, b), device, 3 if smoke else 20)
    FLOORS["matmul"] = 2 * n ** 3 / seconds
    report("floors", f"bf16 matmul {n} cubed", f"{FLOORS['matmul'] / 1e12:.1f} TFLOP/s")
    x = torch.empty((2**20 if smoke else 2**29) // 2, device=device, dtype=torch.bfloat16)  # 1 GiB on the GPU
    y = torch.empty_like(x)
    seconds = timed(lambda: y.copy_(x), device, 3 if smoke else 20)
    FLOORS["copy"] = 2 * x.numel() * x.element_size() / seconds
    report("floors", f"device copy of {x.numel() * 2 / 2**20:.0f} MiB (read + written)",
           f"{FLOORS['copy'] / 1e9:.1f} GB/s")


def timed(fn, device, repeats):
    """The median seconds of fn() over `repeats` calls after one untimed."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        tic = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - tic)
    return float(np.median(times))


# ----- 2. goldens ----------------------------------------------------------------------------------------

def goldens(directory, cases, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for case in cases:
        path = os.path.join(directory, case)
        config = C.XLNetConfig.from_json(os.path.join(path, "xlnet_config.json"))
        run = C.RunConfig.from_json(os.path.join(path, "run_config.json"))
        features, expected = np.load(os.path.join(path, "features.npz")), np.load(os.path.join(path, "expected.npz"))
        for attention in C.ATTENTIONS:
            model = modeling.XLNet(config, run, attention=attention).eval()
            tf_checkpoint.load_original(model, os.path.join(path, "model.ckpt"))
            model.to(device)
            mems = [torch.from_numpy(features[f"mems_in_0_{layer}"]).to(device) for layer in range(config.n_layer)]
            worst_loss = worst_mems = 0.0
            with torch.no_grad():
                for step in range(2):
                    batch = {key: torch.from_numpy(features[f"{key}_{step}"]).to(device) for key in FEATURE_KEYS}
                    out = model(batch, mems)
                    worst_loss = max(worst_loss, float(np.abs(out.token_loss.cpu().numpy()
                                                              - expected[f"token_loss_{step}"]).max()))
                    worst_mems = max(worst_mems, max(float(np.abs(mem.cpu().numpy()
                                                                  - expected[f"new_mems_{step}_{layer}"]).max())
                                                     for layer, mem in enumerate(out.new_mems)))
                    mems = out.new_mems
            atol = STORED_ATOL.get(case, 1e-5)
            report("goldens", f"{case}, {attention}", f"{verdict(worst_loss <= atol and worst_mems <= atol)} "
                   f"(per-token loss {worst_loss:.1e}, memories {worst_mems:.1e}; tolerance {atol:g})")


# ----- 3. flex, 4. accumulation, 5. recomputation ----------------------------------------------------------

def random_batch(bsz, seq_len, num_predict, n_token, device, seed):
    """bench_train's synthetic batch (the input pipeline's shapes and dtypes, random content) on the device."""
    features = synthetic_features(bsz, seq_len, num_predict, n_token, seed)
    return {key: torch.from_numpy(features[key]).to(device) for key in FEATURE_KEYS}


def small_case(shape_name, layers=2, **run_changes):
    """The shape's model with fewer layers, its run, 4 rows of a random batch."""
    model_config, seq_len, reuse_len, mem_len, num_predict = SHAPES[shape_name]
    model_config = dataclasses.replace(model_config, n_layer=min(model_config.n_layer, layers))
    run = C.RunConfig(mem_len=mem_len, reuse_len=reuse_len, bi_data=True, **run_changes)
    return model_config, run, seq_len, num_predict


def gradients_of(model, batch, mems, bfloat16, steps=1):
    """(loss, {name: gradient}, new memories) of one forward_backward (the trainer's), `steps` micro-batches."""
    model.zero_grad(set_to_none=True)
    device = batch["input_k"].device
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bfloat16)
    loss, new_mems = forward_backward(model, batch, mems, steps, True, autocast)
    return loss, {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}, new_mems


def relative(got, want, norm=False):
    got, want = got.double(), want.double()
    if norm:
        return float((got - want).norm() / want.norm().clamp(min=1e-30))
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def flex_check(shape_name, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    model_config, run, seq_len, num_predict = small_case(shape_name)
    eager = modeling.XLNet(model_config, run)
    modeling.init_weights(eager, run, torch.Generator().manual_seed(0))
    flex = modeling.XLNet(model_config, run, attention="flex")
    flex.load_state_dict(eager.state_dict())
    eager.to(device).train()
    flex.to(device).train()
    batch = random_batch(4, seq_len, num_predict, model_config.n_token, device, 3)
    mems = [torch.randn(run.mem_len, 4, model_config.d_model, device=device) for _ in range(model_config.n_layer)]
    for bfloat16, tolerance in ((False, 1e-5), (True, 1e-2)):
        (loss_f, grads_f, mems_f), (loss_e, grads_e, mems_e) = (gradients_of(m, batch, mems, bfloat16)
                                                                for m in (flex, eager))
        outputs = max([relative(loss_f, loss_e)] + [relative(a, b, bfloat16) for a, b in zip(mems_f, mems_e)])
        if bfloat16:  # the whole gradient, one vector (see tests/test_torch_attention.py)
            grads = relative(torch.cat([g.flatten() for g in grads_f.values()]),
                             torch.cat([g.flatten() for g in grads_e.values()]), norm=True)
        else:
            grads = max(relative(grads_f[name], grad) for name, grad in grads_e.items())
        report("flex", f"{shape_name} ({model_config.n_layer} layers, 4 rows), {'bf16' if bfloat16 else 'float32'}",
               f"{verdict(outputs <= tolerance and grads <= tolerance)} (loss and memories {outputs:.1e}, gradients "
               f"{grads:.1e} relative; tolerance {tolerance:g})")


def accumulation(shape_name, device):
    """K = 2, 4 against K = 1 on the same rows: loss and every gradient."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model_config, run, seq_len, num_predict = small_case(shape_name, layers=4)
    model = modeling.XLNet(model_config, run)
    modeling.init_weights(model, run, torch.Generator().manual_seed(0))
    model.to(device).train()
    batch = random_batch(8, seq_len, num_predict, model_config.n_token, device, 4)
    mems = [torch.randn(run.mem_len, 8, model_config.d_model, device=device) for _ in range(model_config.n_layer)]
    loss, grads, new_mems = gradients_of(model, batch, mems, False)
    for k in (2, 4):
        loss_k, grads_k, new_mems_k = gradients_of(model, batch, mems, False, steps=k)
        worst_grad = max(relative(grads_k[name], grad, norm=True) for name, grad in grads.items())
        worst_mems = max(relative(a, b) for a, b in zip(new_mems_k, new_mems))
        loss_diff = relative(loss_k, loss)
        report("accumulation", f"{shape_name} ({model_config.n_layer} layers, 8 rows) K={k} against K=1",
               f"{verdict(loss_diff <= 1e-5 and worst_grad <= 1e-5 and worst_mems <= 1e-5)} (loss {loss_diff:.1e} "
               f"relative, gradients {worst_grad:.1e} of their norm, memories {worst_mems:.1e})")


def recomputation(shape_name, device):
    model_config, run, seq_len, num_predict = small_case(shape_name, layers=4, dropout=0.1, dropatt=0.1)
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
    report("recomputation", f"{shape_name} ({model_config.n_layer} layers, dropout 0.1)",
           f"{verdict(loss_diff <= 1e-6 and grad_diff <= 1e-6)} (loss {loss_diff:.1e} relative, gradients "
           f"{grad_diff:.1e} of their norm)")


# ----- 6. features made on the device ------------------------------------------------------------------------

def features_on_device(shape_name, bsz, device):
    _, seq_len, reuse_len, _, num_predict = SHAPES[shape_name]
    config = C.InputConfig(seq_len=seq_len, reuse_len=reuse_len, perm_size=reuse_len, bsz_per_host=bsz,
                           num_predict=num_predict, bi_data=True)
    rng = np.random.default_rng(5)
    is_masked = np.zeros((bsz, seq_len), np.int64)
    for row in is_masked:
        row[rng.permutation(seq_len)[:num_predict - 5]] = 1
    records = {"input": rng.integers(10, 1000, (bsz, seq_len)), "target": rng.integers(10, 1000, (bsz, seq_len)),
               "seg_id": (np.arange(seq_len) >= reuse_len).astype(np.int64)[None].repeat(bsz, 0),
               "is_masked": is_masked, "label": np.zeros((bsz, 1), np.int64)}
    permutation = examples.seeded_permutation(0, config.perm_size)
    host = examples.features(records, np.arange(bsz), config, permutation)
    shipped = examples.shipped(records, np.arange(bsz), config, permutation)
    made = device_features.on_device(shipped, device, num_predict)
    same = all(torch.equal(made[key].cpu(), torch.from_numpy(value)) for key, value in host.items())
    report("features", f"{shape_name} {bsz} rows: made on the device == made on the host", verdict(same))
    tensors = {name: torch.from_numpy(value) for name, value in shipped.items()}
    expand = timed(lambda: device_features.expand({k: v.to(device) for k, v in tensors.items()}, num_predict),
                   device, 10)
    copy_host = timed(lambda: {k: torch.from_numpy(v).to(device) for k, v in host.items()}, device, 10)
    report("features", f"{shape_name} {bsz} rows a step", f"shipped copied and expanded {1000 * expand:.2f} ms; "
           f"host-made copied {1000 * copy_host:.2f} ms ({sum(v.nbytes for v in shipped.values()) / 2**20:.2f} MiB "
           f"against {sum(v.nbytes for v in host.values()) / 2**20:.1f} MiB)")


# ----- 7. speed, 8. profile, 9. fit ------------------------------------------------------------------------

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


def make_step(impl, shape_name, bsz, device, bfloat16, variant=Variant("eager"), recompute=False):
    """(one_step: a training step (forward, backward, clipping, Adam), its state {"mems", "loss"}, the model)."""
    model_config, seq_len, reuse_len, mem_len, num_predict = SHAPES[shape_name]
    run = C.RunConfig(mem_len=mem_len, reuse_len=reuse_len, bi_data=True)
    if impl == "ours":
        model = modeling.XLNet(model_config, run, recompute=recompute, attention=variant.attention)
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
    if variant.compile:
        forward = torch.compile(forward, mode="reduce-overhead" if variant.cuda_graphs else None)
    if variant.trainer_adam:
        data = C.InputConfig(seq_len=seq_len, reuse_len=reuse_len, perm_size=reuse_len, bsz_per_host=bsz,
                             num_predict=num_predict, bi_data=True)
        cfg = C.TrainConfig(record_info_dir="unused", model_dir="unused", model=model_config, run=run, data=data,
                            learning_rate=1e-4, train_steps=10**6)
        trainer_optimizer = AdamWeightDecay(dict(model.named_parameters()), cfg)
        parameters = list(trainer_optimizer.parameters.values())

        def update():
            clip_by_global_norm(parameters, 1.0)
            trainer_optimizer.apply()
            for p in parameters:
                p.grad = None
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-8,
                                     **({"fused": True} if variant.fused_adam else {}))

        def update():
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    batch = random_batch(bsz, seq_len, num_predict, model_config.n_token, device, 0)
    state = {"mems": mems}

    def one_step():
        if variant.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bfloat16):
            loss, new_mems = forward(batch, state["mems"])
        loss.backward()
        update()
        # a copy: CUDA graphs' outputs are overwritten by the next replay
        state["mems"] = [mem.detach().clone() for mem in new_mems]
        state["loss"] = loss.detach().clone()
    return one_step, state, model_config


def time_steps(impl, shape_name, bsz, device, bfloat16, steps, warmup, variant=Variant("eager"), recompute=False):
    """(median seconds of a training step, torch.cuda.max_memory_allocated over the run, the last loss, and for our
    module on a GPU the plan of pretrain_torch/planning.py against the allocator's peak of one more step)."""
    one_step, state, model_config = make_step(impl, shape_name, bsz, device, bfloat16, variant, recompute)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
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
        plan = planning.allocator_check(model_config, step_shape(shape_name, bsz, bfloat16, recompute), one_step,
                                        device).row()
    return float(np.median(times)), peak, state["loss"].item(), plan


def speed_row(shape_name, name, bsz, device, peak_tflops, seconds, peak, loss, plan):
    model_config, seq_len = SHAPES[shape_name][:2]
    shape = step_shape(shape_name, bsz, bfloat16=True)
    flops = costs.train_flops(model_config, shape)
    mfu = f", MFU {100 * flops / seconds / 1e12 / peak_tflops:.1f}%" if peak_tflops else ""
    # The floors: the FLOPs at the measured matmul rate; the bytes (at least each byte of the step's planned peak
    # written once and read once) at the measured copy rate.
    floor = ""
    if FLOORS:
        moved = 2 * planning.memory_plan(model_config, shape).total
        floor = (f", floors: matmul {1000 * flops / FLOORS['matmul']:.1f} ms, bytes {1000 * moved / FLOORS['copy']:.1f}"
                 " ms")
    report("speed", f"{shape_name} {name}, {bsz} rows, bf16",
           f"{1000 * seconds:.1f} ms/step, {bsz * seq_len / seconds:,.0f} tokens/s{mfu}{floor}, "
           f"peak {peak / 2**30:.1f} GiB, loss {loss:.2f}{'; memory ' + plan if plan else ''}")


def speed(shape_name, bsz, device, peak_tflops, variants, steps, warmup, hf_variant, out_of_time):
    """Each variant's step, then Hugging Face's; returns the fastest variant of ours (None if none ran)."""
    best = None
    runs = [("ours", variant) for variant in variants] + [("hf", hf_variant)]
    for impl, variant in runs:
        name = (f"pretrain_torch XLNet {variant.name}" if impl == "ours"
                else f"Hugging Face XLNetLMHeadModel {variant.name}")
        if out_of_time():
            report("speed", f"{shape_name} {name}", "skipped (--budget_s spent)")
            continue
        try:
            seconds, peak, loss, plan = time_steps(impl, shape_name, bsz, device, True, steps, warmup, variant)
        except torch.cuda.OutOfMemoryError:
            report("speed", f"{shape_name} {name}, {bsz} rows, bf16", "out of memory")
            torch.cuda.empty_cache()
            continue
        except Exception as err:  # a variant that does not run here (a compiler's limit) is a row, not the end
            report("speed", f"{shape_name} {name}, {bsz} rows, bf16", f"failed: {type(err).__name__}: "
                   f"{str(err).splitlines()[0][:200] if str(err) else ''}")
            continue
        finally:
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        speed_row(shape_name, name, bsz, device, peak_tflops, seconds, peak, loss, plan)
        if impl == "ours" and (best is None or seconds < best[1]):
            best = (variant, seconds)
    if best is not None:
        hf_rows = [row for row in ROWS if row[1].startswith(f"{shape_name} Hugging Face") and "ms/step" in row[2]]
        if hf_rows:
            hf_seconds = float(hf_rows[-1][2].split(" ms/step")[0]) / 1000
            report("speed", f"{shape_name} fastest of ours ({best[0].name}) against Hugging Face's",
                   f"{hf_seconds / best[1]:.2f}x")
    return None if best is None else best[0]


def profile(shape_name, bsz, device, variant, smoke):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    one_step, _, _ = make_step("ours", shape_name, bsz, device, True, variant)
    for _ in range(1 if smoke else 3):  # compiled and warm
        one_step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(1 if smoke else 3):
            one_step()
        synchronize(device)
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"\nprofile: {shape_name} {variant.name}, {bsz} rows, {1 if smoke else 3} steps, by {sort}:")
    print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60), flush=True)
    report("profile", f"{shape_name} {variant.name}", "table printed above")


def fits(shape_name, bsz, device, bfloat16):
    """time_steps' figures of two eager steps of our module (and the allocator check), None when out of memory."""
    try:
        return time_steps("ours", shape_name, bsz, device, bfloat16, steps=1, warmup=1)
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


PARTS = "floors,goldens,flex,accumulation,recomputation,features,speed,profile,fit"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goldens", required=True, help="a folder of the model goldens (gpu_carry/golden_model)")
    parser.add_argument("--cases", default="m1_bi_untied,m2_uni_tied,m3_sharp", help="the goldens to run")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, no compile")
    parser.add_argument("--parts", default=PARTS, help="which parts, comma-separated")
    parser.add_argument("--bsz", type=int, default=16, help="rows per step of the speed part (even: bi_data)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each speed variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiling, autotuning)")
    parser.add_argument("--max_bsz", type=int, default=256, help="the fit part's cap")
    parser.add_argument("--budget_s", type=float, default=450, help="parts (and speed variants) not started after "
                        "this many seconds are skipped, so that the call ends under 8 minutes")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    peak_tflops = costs.peak_tflops(name, bfloat16=True)
    print(f"{name}; torch {torch.__version__}; peak {peak_tflops or 'unknown'} TFLOP/s bf16", flush=True)
    if args.smoke:  # torch refuses FlexAttention's backward on the CPU in its front end; its reference one runs
        import torch.nn.attention.flex_attention as flex_module
        flex_module._validate_device = lambda query, key, value: None
    parts = args.parts.split(",")
    start = time.perf_counter()

    def out_of_time():
        return time.perf_counter() - start > args.budget_s

    shapes = ["smoke"] if args.smoke else ["XLNet-Base", "XLNet-Large"]
    variants = [v for v in VARIANTS if not args.smoke or not (v.compile or v.cuda_graphs)]
    if args.smoke:  # no compiling on the CPU: each variant's other settings, eager
        variants += [Variant("flex", attention="flex"), Variant("flex + fused Adam", attention="flex", fused_adam=True),
                     Variant("flex + the trainer's Adam", attention="flex", trainer_adam=True)]
    hf_variant = Variant("eager") if args.smoke else Variant("compiled", compile=True)
    best = None
    for part in PARTS.split(","):
        if part not in parts:
            continue
        if out_of_time():
            report(part, "all", "skipped (--budget_s spent)")
            continue
        if part == "floors":
            floors(device, args.smoke)
        elif part == "goldens":
            goldens(args.goldens, args.cases.split(","), device)
        elif part == "flex":
            flex_check(shapes[0], device)
        elif part == "accumulation":
            accumulation(shapes[0], device)
        elif part == "recomputation":
            recomputation(shapes[0], device)
        elif part == "features":
            features_on_device(shapes[0], args.bsz, device)
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 in the fit part: as a user would train
        if part == "speed":
            best = speed(shapes[0], args.bsz, device, peak_tflops, variants, args.steps, args.warmup, hf_variant,
                         out_of_time)
            if len(shapes) > 1 and best is not None:
                speed(shapes[1], args.bsz // 2, device, peak_tflops, [best], args.steps, args.warmup, hf_variant,
                      out_of_time)
        elif part == "profile":
            profile(shapes[0], args.bsz, device, best or variants[0], args.smoke)
        elif part == "fit":
            for bfloat16 in (True, False):
                largest_batch(shapes[0], device, bfloat16, 2 if args.smoke else args.max_bsz)
    print(f"\n{name}, {time.perf_counter() - start:.0f} s:")
    width = max(len(f"{section}: {what}") for section, what, _ in ROWS)
    for section, what, figure in ROWS:
        print(f"  {f'{section}: {what}':{width}s}  {figure}")


if __name__ == "__main__":
    main()
