"""Forward-mode instruments (jvp eNTK, ``linearize``, NFK embedding) on attention models.

Regression for issue 20 item 1: on CPU, ``F.scaled_dot_product_attention`` has no forward-AD
rule, so these raised ``NotImplementedError`` on dynascope's ``Transformer`` and on Hugging Face
GPT-2 with SDPA attention. Oracles, all reverse mode: the Jacobian ``[n, d_out, P]`` built row
by row with ``torch.autograd.grad`` outside any transform (so through the fused SDPA kernel that
forward mode cannot use), and the ``jacobian`` eNTK strategy (``vmap`` of ``jacrev``); the NFK
Gram from per-example reverse-mode gradients. Tolerances: float64 throughout, 1e-9 relative
and 1e-10 absolute: the two sides sum the same terms in a different order over a few hundred
parameters (measured: eNTK entries up to 5e4 off by <= 1.1e-10, i.e. <= 3e-15 relative;
GPT-2 eNTK <= 8e-14, its linearization <= 5e-17; Llama: see its test).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.autograd import forward_ad
from torch.testing import assert_close
from transformers import GPT2Config, GPT2LMHeadModel

from dynascope.adapters import autodiff_transform_active, explicit_attention
from dynascope.nn import HyperUT, Transformer, UniversalTransformer, ViT
from dynascope.nn.hypernet_transformer import SequenceTransformer
from dynascope.probes import (
    empirical_ntk,
    jem_score,
    linearize,
    model_function,
    nfk_embedding,
    nfk_gram,
)

F64 = torch.float64
TOL = dict(rtol=1e-9, atol=1e-10)
BATCH, POS, D_VOCAB = 3, 5, 11


def _tokens(seed=1, n=BATCH):
    return torch.randint(0, D_VOCAB, (n, POS), generator=torch.Generator().manual_seed(seed))


def _vectors(d_in, seed=1, n=BATCH):
    return torch.randn(n, POS, d_in, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _transformer():
    torch.manual_seed(0)
    return Transformer(n_layers=2, d_model=6, n_heads=2, d_head=3, d_mlp=7, d_vocab=D_VOCAB,
                       d_out=2, n_ctx=POS, use_bias=True).to(F64).eval()  # fmt: skip


def _gpt2(attn_implementation="sdpa"):
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=6, n_head=2, vocab_size=D_VOCAB, n_positions=POS, bos_token_id=0,
        eos_token_id=1, attn_implementation=attn_implementation,
    )  # fmt: skip
    return GPT2LMHeadModel(config).to(F64).eval()


class _LastLogits(nn.Module):
    """GPT-2's logits at the last position, ``[batch, d_vocab]`` (a plain-tensor output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).logits[:, -1]


def _explicit_jacobian(model_fn, params, x):
    """``[n, d_out, P]``: one reverse pass per output entry (independent of torch.func)."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    out = model_fn(leaves, x)
    rows = []
    for i in range(out.shape[0]):
        for c in range(out.shape[1]):
            grads = torch.autograd.grad(out[i, c], list(leaves.values()), retain_graph=True)
            rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows).view(out.shape[0], out.shape[1], -1)


def _ntk_oracle(model_fn, params, x):
    J = _explicit_jacobian(model_fn, params, x)
    return torch.einsum("icp,jdp->ijcd", J, J)


# ------------------------------------------------------------------------- the detection


def test_autodiff_transform_active_tracks_every_entry_point():
    """Pinned against torch: a move of either private flag in an upgrade fails here first."""
    x = torch.ones(2)
    seen = []

    def f(t):
        seen.append(autodiff_transform_active())
        return t

    f(x)
    torch.func.jvp(f, (x,), (x,))
    with forward_ad.dual_level():
        f(forward_ad.make_dual(x, x))
    torch.func.vmap(f)(x)
    torch.func.grad(lambda t: f(t).sum())(x)
    torch.func.vjp(f, x)
    assert seen == [False, True, True, True, True, True]
    assert not autodiff_transform_active()
    compiled = torch.compile(f, backend="eager", fullgraph=True)  # dynamo traces, no graph break
    compiled(x)
    assert seen[-1] is False


# ------------------------------------------------------------------ dynascope's own models


def _dynascope_cases():
    torch.manual_seed(0)
    return {
        "Transformer": (_transformer(), _tokens()),
        "ViT": (
            ViT(n_layers=1, d_model=6, n_heads=2, d_mlp=7, d_in=4, n_patches=POS, d_out=2),
            _vectors(4),
        ),
        "SequenceTransformer": (
            SequenceTransformer(
                d_in=4, d_out=2, d_model=6, n_layers=1, n_heads=2, d_mlp=7, is_causal=False
            ),
            _vectors(4),
        ),
    }


@pytest.mark.parametrize("name", ["Transformer", "ViT", "SequenceTransformer"])
def test_jvp_vjp_entk_on_dynascope_attention_models_matches_reverse_mode(name):
    model, x = _dynascope_cases()[name]
    model = model.to(F64).eval()
    model_fn, params = model_function(model)
    K = empirical_ntk(model_fn, params, x, strategy="jvp_vjp")
    assert_close(K, _ntk_oracle(model_fn, params, x), **TOL)
    assert_close(K, empirical_ntk(model_fn, params, x, strategy="jacobian"), **TOL)
    assert_close(
        empirical_ntk(model_fn, params, x, strategy="jvp_vjp", mode="trace"),
        torch.diagonal(K, dim1=2, dim2=3).sum(-1),
        **TOL,
    )


def _delta(params, seed=2, size=1e-3):
    g = torch.Generator().manual_seed(seed)
    return {k: size * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in params.items()}


def _linear_oracle(model_fn, params, delta, x):
    """``f(theta0, x) + J(x) delta`` with the explicit reverse-mode Jacobian."""
    J = _explicit_jacobian(model_fn, params, x)
    flat = torch.cat([delta[k].reshape(-1) for k in params])
    return model_fn(params, x) + J @ flat


@pytest.mark.parametrize("name", ["Transformer", "UniversalTransformer", "HyperUT"])
def test_linearize_on_dynascope_attention_models_matches_reverse_mode(name):
    """UniversalTransformer / HyperUT: ACT's data-dependent loop rules out vmap over examples
    (both eNTK strategies), but one jvp per call (``linearize``) goes through."""
    torch.manual_seed(0)
    kw = dict(d_vocab=D_VOCAB, d_out=2, n_ctx=POS, d_model=6, n_heads=2, d_mlp=7, act_max_steps=3)
    build = {
        "Transformer": _transformer,
        "UniversalTransformer": lambda: UniversalTransformer(**kw),
        "HyperUT": lambda: HyperUT(n_banks=2, **kw),
    }[name]
    model = build().to(F64).eval()
    x = _tokens()
    model_fn, params = model_function(model)
    f_lin = linearize(model_fn, params)
    delta = _delta(params)
    moved = {k: params[k] + delta[k] for k in params}
    assert_close(f_lin(moved, x), _linear_oracle(model_fn, params, delta, x), **TOL)
    assert_close(f_lin(params, x), model_fn(params, x), **TOL)


def test_nfk_embedding_on_transformer_matches_the_reverse_mode_gram():
    """Full-rank sketch (k = N): the embedding's Gram is the exact NFK Gram."""
    model = _transformer()
    x = _tokens(n=4)
    model_fn, params = model_function(model)

    def score_fn(p, xb):
        return jem_score(model_fn(p, xb))

    emb = nfk_embedding(score_fn, params, x, k=4, generator=torch.Generator().manual_seed(0))
    gram = nfk_gram(score_fn, params, x)
    assert_close(emb.embedding @ emb.embedding.mT, gram, **TOL)


# -------------------------------------------------------------------- Hugging Face GPT-2


def _sdpa_fn(model):
    """``model_fn`` without :func:`explicit_attention`: the model's own SDPA kernel (oracle)."""
    return lambda p, x: torch.func.functional_call(model, p, (x,))


def test_jvp_vjp_entk_and_linearize_on_gpt2_sdpa_match_reverse_mode_and_restore_sdpa():
    gpt2 = _gpt2("sdpa")
    model = _LastLogits(gpt2)
    x = _tokens()
    model_fn, params = model_function(model)
    K = empirical_ntk(model_fn, params, x, strategy="jvp_vjp")
    assert gpt2.config._attn_implementation == "sdpa"  # restored after every call
    assert_close(K, _ntk_oracle(_sdpa_fn(model), params, x), **TOL)
    assert_close(K, empirical_ntk(model_fn, params, x, strategy="jacobian"), **TOL)

    f_lin = linearize(model_fn, params)
    delta = _delta(params)
    moved = {k: params[k] + delta[k] for k in params}
    assert_close(f_lin(moved, x), _linear_oracle(_sdpa_fn(model), params, delta, x), **TOL)
    assert gpt2.config._attn_implementation == "sdpa"


def test_jvp_vjp_entk_on_llama_sdpa_matches_reverse_mode_through_sdpa():
    """Llama's eager kernel takes its softmax (and so its derivatives) in float32 even for a
    float64 model, so the tolerance is float32's: 1e-5 of the kernel's largest entry (43;
    measured 1.6e-6 against the SDPA oracle, 1.7e-6 against the jacobian strategy)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
        intermediate_size=5, vocab_size=D_VOCAB, num_hidden_layers=1,
        max_position_embeddings=POS, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        attn_implementation="sdpa",
    )  # fmt: skip
    llama = LlamaForCausalLM(config).to(F64).eval()
    model, x = _LastLogits(llama), _tokens()
    model_fn, params = model_function(model)
    K = empirical_ntk(model_fn, params, x, strategy="jvp_vjp")
    assert llama.config._attn_implementation == "sdpa"
    oracle = _ntk_oracle(_sdpa_fn(model), params, x)
    float32 = dict(rtol=0, atol=1e-5 * oracle.abs().max().item())
    assert_close(K, oracle, **float32)
    assert_close(K, empirical_ntk(model_fn, params, x, strategy="jacobian"), **float32)


def test_nfk_embedding_on_gpt2_sdpa_inside_explicit_attention():
    """A hand-written score_fn over an HF model: the caller wraps the instrument."""
    gpt2 = _gpt2("sdpa")
    x = _tokens(n=4)
    params = {k: v.detach() for k, v in gpt2.named_parameters()}

    def score_fn(p, xb):
        return jem_score(torch.func.functional_call(gpt2, p, (xb,)).logits[:, -1])

    with pytest.raises(NotImplementedError, match="forward AD"):  # SDPA itself, upstream
        torch.func.jvp(lambda p: score_fn(p, x), (params,), (params,))
    with explicit_attention(gpt2):
        assert gpt2.config._attn_implementation == "eager"
        emb = nfk_embedding(score_fn, params, x, k=4, generator=torch.Generator().manual_seed(0))
    assert gpt2.config._attn_implementation == "sdpa"
    # Oracle: centred Gram of per-example reverse-mode gradients through SDPA (no torch.func).
    J = _explicit_jacobian(lambda p, xb: score_fn(p, xb)[:, None], params, x)[:, 0]  # [N, P]
    U = J - J.mean(dim=0)
    assert_close(emb.embedding @ emb.embedding.mT, U @ U.mT, **TOL)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_explicit_attention_restores_the_callers_backend_also_on_error(implementation):
    gpt2 = _gpt2(implementation)
    with pytest.raises(RuntimeError, match="inside"):
        with explicit_attention(gpt2):
            assert gpt2.config._attn_implementation == "eager"
            assert gpt2.transformer.config._attn_implementation == "eager"
            raise RuntimeError("inside")
    assert gpt2.config._attn_implementation == implementation
    plain = _transformer()
    with explicit_attention(plain):  # no Hugging Face submodel: nothing to switch
        pass


def test_jvp_vjp_entk_on_torch_multihead_attention_and_fastpath_restored():
    """nn.MultiheadAttention in eval mode takes a fused fast path without a forward-AD rule;
    model_function switches it off per call (need_weights=True, the default) and restores it."""
    torch.manual_seed(0)

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(6, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)[0]

    model = SelfAttention().to(F64).eval()
    x = _vectors(6)
    model_fn, params = model_function(model)
    K = empirical_ntk(model_fn, params, x, strategy="jvp_vjp")
    assert torch.backends.mha.get_fastpath_enabled()
    assert_close(K, _ntk_oracle(model_fn, params, x), **TOL)
