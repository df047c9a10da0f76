"""Random padded attention inputs and a method attached to a tiny BERT's real attention module: what the
method checks (sparse and structured-dropout tests) feed to `method.attention` directly."""
import torch

import suite
from suite.api.attention import attention_modules
from suite.testing import tiny_model

B, H, L, D = 3, 4, 7, 8          # tiny_config: hidden 32 = 4 heads x 8
LENGTHS = [7, 5, 2]              # one unpadded row, two padded ones
SPARSE = ["rela", "topk", "sparsemax", "entmax15", "entmax_alpha", "drophead", "dropattention_col", "dropkey"]


def padded_qkv(dtype=torch.float64, seed=0, spread=1.0, lengths=LENGTHS, length=L):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(len(lengths), H, length, D, generator=g, dtype=torch.float64).mul(spread)
               .to(dtype).requires_grad_() for _ in range(3))
    valid = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]            # (B, Lk)
    mask = torch.zeros(len(lengths), 1, length, length, dtype=dtype)
    mask = mask.masked_fill(~valid[:, None, None, :], torch.finfo(dtype).min)         # transformers' eager form
    return q, k, v, mask, valid


def attached_method(name, dtype=torch.float64, training=False, **hp):
    """The method and layer 0's real attention module of a tiny BERT (parameters added by `prepare`)."""
    cls = suite.METHODS.get(name)
    method = cls(cls.Config(**hp))
    model = tiny_model("bert")
    method.attach(model)
    model.to(dtype).train(training)
    return method, attention_modules(model)[0], model


def run_attention(method, module, q, k, v, mask):
    return method.attention(module, q, k, v, mask, D ** -0.5)


def padding_weight(probs, valid):
    return probs.masked_select(~valid[:, None, None, :].expand_as(probs))
