"""The PyTorch trainer's AdamWeightDecay (pretrain_torch/optim.py) runs each operation over every tensor at once
(torch._foreach_*; issue 47: a few kernels a step instead of about 2,500 at XLNet-Base): bit for bit the per-tensor
rules it replaced (kept here as the reference), with and without weight decay, over steps, with a parameter that
has no gradient. test_torch_train holds it to train_gpu's optimiser."""

import pytest
import torch

from xlnet_data.pretrain import config as C
from xlnet_data.pretrain.schedule import BETA_1, BETA_2, learning_rate
from xlnet_data.pretrain_torch.optim import AdamWeightDecay


def reference_apply(opt: AdamWeightDecay) -> None:
    """The per-tensor loop AdamWeightDecay.apply ran before issue 47."""
    lr = learning_rate(opt.step, opt.cfg)
    t = opt.step + 1
    alpha = lr * (1 - BETA_2 ** t) ** 0.5 / (1 - BETA_1 ** t)
    eps = opt.cfg.adam_epsilon
    with torch.no_grad():
        for name, p in opt.parameters.items():
            grad, m, v = p.grad, opt.m[name], opt.v[name]
            if grad is None:
                continue
            if opt.cfg.weight_decay == 0:
                m.add_((grad - m) * (1 - BETA_1))
                v.add_((grad * grad - v) * (1 - BETA_2))
                p.sub_(m * alpha / (v.sqrt() + eps))
            else:
                m.mul_(BETA_1).add_(grad, alpha=1 - BETA_1)
                v.mul_(BETA_2).add_(grad * grad, alpha=1 - BETA_2)
                update = m / (v.sqrt() + eps)
                if opt.decay[name]:
                    update = update + opt.decay[name] * p
                p.sub_(lr * update)
    opt.step += 1


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_foreach_update_is_the_per_tensor_rule_bit_for_bit(weight_decay):
    data = C.InputConfig(seq_len=8, reuse_len=4, perm_size=4, bsz_per_host=2, bi_data=False)
    cfg = C.TrainConfig(record_info_dir="unused", model_dir="unused", model=C.XLNetConfig(), data=data,
                        run=C.RunConfig(reuse_len=4), weight_decay=weight_decay, learning_rate=1e-2,
                        warmup_steps=2, train_steps=10)
    generator = torch.Generator().manual_seed(0)
    shapes = {"transformer.layer.0.ff.layer_1.weight": (5, 3), "transformer.layer.0.ff.layer_1.bias": (3,),
              "transformer.layer.0.rel_attn.layer_norm.weight": (4,), "transformer.mask_emb": (1, 1, 4)}
    start = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    sides = []
    for _ in range(2):
        params = {name: torch.nn.Parameter(value.clone()) for name, value in start.items()}
        sides.append(AdamWeightDecay(params, cfg))
    ours, reference = sides
    assert any(ours.decay.values()) == bool(weight_decay) and not all(ours.decay.values())
    for step in range(4):
        grads = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
        grads["transformer.mask_emb"] = None if step == 1 else grads["transformer.mask_emb"]  # no gradient this step
        for opt in sides:
            for name, p in opt.parameters.items():
                p.grad = None if grads[name] is None else grads[name].clone()
        assert ours.apply() == learning_rate(step, cfg)
        reference_apply(reference)
        for name in shapes:
            for got, want in ((ours.parameters[name], reference.parameters[name]), (ours.m[name], reference.m[name]),
                              (ours.v[name], reference.v[name])):
                assert torch.equal(got, want), f"step {step} {name}"
    assert ours.step == reference.step == 4
