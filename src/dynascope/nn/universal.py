"""Universal Transformer with adaptive computation time (ACT), and Hyper-UT.

Glossary (TransformerLens names; everything right-multiplies, ``x @ W``):
    batch, pos:   sequences and positions; ``n_ctx`` the largest ``pos``.
    d_model, n_heads, d_head, d_mlp: as in :mod:`dynascope.nn.transformer`.
    d_vocab, d_out: input token ids and output classes.
    T:            ``act_max_steps``, the most times the shared block is applied.
    p:            halting probability ``sigmoid(state @ w_halt + b_halt)``, ``[batch, pos]``
                  (``global`` halting: the mean over positions, shared by the sequence).
    hp, rem, n:   accumulated halting probability, remainder, number of updates ``[batch, pos]``.
    w_t:          the weight of step t's state: ``p·running`` or the remainder when halting.
    thr:          ``1 − act_epsilon``.
    ponder cost:  ``act_loss_weight · mean(n + rem)`` (added to the task loss).
    K:            Hyper-UT's number of weight banks; ``mix_t = softmax(s_t @ W_g + b_g)``
                  ``[batch, K]`` from ``s_t``, the state at the readout position (or the mean
                  over positions) before step t; the block's weights are
                  ``W_t = sum_k mix_t[k] W[k]`` per example.

ACT, exactly as tensor2tensor's ``universal_transformer_act`` (per position, ``basic``)::

    hp = rem = n = prev = 0
    while any(hp < thr and n < T):
        state = state + timing(pos) + timing(step)
        p = sigmoid(halting(state))                    # global: mean over positions
        running = hp < 1
        new_halted = (hp + p·running > thr)·running
        running = (hp + p·running <= thr)·running
        hp += p·running;  rem += new_halted·(1 − hp);  hp += new_halted·rem
        n += running + new_halted
        w = p·running + new_halted·rem
        transformed = block(state)
        prev = transformed·w + prev·(1 − w)             # accumulated: prev += transformed·w
        state = transformed
    output = prev

Halted positions are still transformed but weighted 0. Hitting T stops the loop without a
remainder (unlike Graves' ACT; ``force_halt_at_max=True`` assigns it at step T). The oracle:
a constant p = 0.3 gives n = 4, rem = 0.1 and weights 0.3, 0.3, 0.3, 0.1.

Blocks are pre-LN and bidirectional: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))`` (GELU);
the readout is ``ln_final(output[:, readout_pos]) @ W_U + b_U``.

References:
    M. Dehghani, S. Gouws, O. Vinyals, J. Uszkoreit, Ł. Kaiser (2019), "Universal
        Transformers", ICLR, arXiv 1807.03819, Sec. 2.2 (ACT); tensorflow/tensor2tensor
        ``models/research/universal_transformer_util.py`` (``universal_transformer_act``).
    A. Graves (2016), "Adaptive Computation Time for Recurrent Neural Networks",
        arXiv 1603.08983, eq. (5)-(12).
    S. Abnar et al. (2023), "Adaptivity and Modularity for Efficient Generalization Over Task
        Complexity", arXiv 2310.08866 (Hyper-UT; the bank-mixture generator here is our choice).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._act import ACTResult as ACTResult
from ._act import adaptive_computation_time as adaptive_computation_time
from ._act import timing_signal as timing_signal
from .attention import autodiff_transform_active
from .transformer import TransformerBlock

__all__ = [
    "ACTResult",
    "HyperUT",
    "UniversalTransformer",
    "adaptive_computation_time",
    "timing_signal",
]

Halting = Literal["basic", "global"]


class UniversalTransformer(nn.Module):
    """One pre-LN block applied up to ``act_max_steps`` times under ACT; pooled readout.

    Args:
        d_vocab, d_out, n_ctx: token ids, output classes, largest sequence length.
        d_model, n_heads, d_mlp: block sizes.
        act_max_steps: T >= 1.
        halting: ``"basic"`` (per position) or ``"global"`` (per sequence).
        act_epsilon: thr = 1 − act_epsilon.
        act_loss_weight: weight of the ponder cost in :meth:`loss_terms`.
        halting_bias_init: initial bias of the halting unit (tensor2tensor: 1.0).
        multiply_embedding_mode: ``"sqrt_depth"`` (tensor2tensor's default): the token
            embedding ``W_E ~ N(0, 1/d_model)`` is multiplied by ``sqrt(d_model)`` when used,
            so embedded tokens are O(1) like the timing signals; ``"none"``: ``W_E ~ N(0,
            0.02²)`` used as is (tokens 50× smaller than the timing signals at d_model 64).
        readout_pos: position read out by the classifier.
        force_halt_at_max, accumulated: see :func:`adaptive_computation_time`.
    Raises:
        ValueError: for non-positive sizes, ``act_max_steps < 1``, an unknown ``halting`` and
            as :class:`TransformerBlock`.
    References:
        Dehghani et al. (2019), arXiv 1807.03819; tensor2tensor ``universal_transformer.py``
        (hparams ``act_max_steps``, ``act_halting_bias_init``, ``act_epsilon``,
        ``act_loss_weight``); the embedding scale: tensor2tensor ``layers/modalities.py``
        (``get_weights``: ``random_normal_initializer(0.0, hidden_size**-0.5)``; ``bottom``:
        ``ret *= hidden_size**0.5`` when ``multiply_embedding_mode == "sqrt_depth"``).
    """

    def __init__(
        self,
        *,
        d_vocab: int,
        d_out: int,
        n_ctx: int,
        d_model: int,
        n_heads: int,
        d_mlp: int,
        act_max_steps: int = 8,
        halting: Halting = "basic",
        act_epsilon: float = 0.01,
        act_loss_weight: float = 0.01,
        halting_bias_init: float = 1.0,
        multiply_embedding_mode: Literal["sqrt_depth", "none"] = "sqrt_depth",
        readout_pos: int = 0,
        force_halt_at_max: bool = False,
        accumulated: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("d_vocab", d_vocab),
            ("d_out", d_out),
            ("n_ctx", n_ctx),
            ("act_max_steps", act_max_steps),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1 (got {name}={value})")
        if halting not in ("basic", "global"):
            raise ValueError(f"halting must be 'basic' or 'global' (got halting={halting!r})")
        if multiply_embedding_mode not in ("sqrt_depth", "none"):
            raise ValueError(
                "multiply_embedding_mode must be 'sqrt_depth' or 'none' "
                f"(got multiply_embedding_mode={multiply_embedding_mode!r})"
            )
        if not 0 <= readout_pos < n_ctx:
            raise ValueError(f"readout_pos must be in 0..{n_ctx - 1} (got {readout_pos})")
        self.d_model, self.n_heads, self.d_mlp, self.n_ctx = d_model, n_heads, d_mlp, n_ctx
        self.act_max_steps, self.halting_kind = act_max_steps, halting
        self.act_epsilon, self.act_loss_weight = act_epsilon, act_loss_weight
        self.readout_pos = readout_pos
        self.force_halt_at_max, self.accumulated = force_halt_at_max, accumulated
        self.multiply_embedding_mode = multiply_embedding_mode
        if multiply_embedding_mode == "sqrt_depth":
            self.W_E = nn.Parameter(torch.randn(d_vocab, d_model) / math.sqrt(d_model))
            self.embedding_scale = math.sqrt(d_model)
        else:
            self.W_E = nn.Parameter(torch.randn(d_vocab, d_model) * 0.02)
            self.embedding_scale = 1.0
        self.register_buffer("pos_signal", timing_signal(n_ctx, d_model), persistent=False)
        self.register_buffer("step_signal", timing_signal(act_max_steps, d_model), persistent=False)
        self.halt = nn.Linear(d_model, 1)
        nn.init.constant_(self.halt.bias, halting_bias_init)
        self.block = self._make_block()
        self.ln_final = nn.LayerNorm(d_model)
        self.W_U = nn.Parameter(torch.randn(d_model, d_out) / math.sqrt(d_model))
        self.b_U = nn.Parameter(torch.zeros(d_out))

    def _make_block(self) -> nn.Module:
        return TransformerBlock(self.d_model, self.n_heads, d_mlp=self.d_mlp, is_causal=False)

    def _transform(self, state: Tensor, step: int) -> Tensor:
        return self.block(state)

    def _halting(self, state: Tensor) -> Tensor:
        p = torch.sigmoid(self.halt(state))[..., 0]  # [batch, pos]
        if self.halting_kind == "global":
            p = p.mean(-1, keepdim=True).expand_as(p)
        return p

    def _signal(self, state: Tensor, step: int) -> Tensor:
        return state + self.pos_signal[: state.shape[1]] + self.step_signal[step]

    def act(self, tokens: Tensor) -> ACTResult:
        """Run ACT on token ids ``[batch, pos]``; the result's ``output`` is the final state.

        Raises:
            ValueError: if ``tokens`` is not a long ``[batch, pos]`` tensor with pos <= n_ctx.
        """
        if tokens.ndim != 2 or tokens.dtype != torch.long or tokens.shape[1] > self.n_ctx:
            raise ValueError(
                f"tokens must be a long tensor [batch, pos <= {self.n_ctx}] "
                f"(got {tokens.dtype}, {tuple(tokens.shape)})"
            )
        return self.act_state(self.embed(tokens))

    def embed(self, tokens: Tensor) -> Tensor:
        """Embedded tokens ``W_E[tokens] · embedding_scale`` ``[batch, pos, d_model]``."""
        return self.W_E[tokens] * self.embedding_scale

    def act_state(self, state: Tensor) -> ACTResult:
        """Run ACT from an embedded state ``[batch, pos, d_model]`` (pos <= n_ctx).

        For inputs that are not token ids (e.g. image patches embedded by the caller); the
        position and step timing signals are added as in :meth:`act`.

        Raises:
            ValueError: if ``state`` is not ``[batch, pos <= n_ctx, d_model]``.
        """
        if state.ndim != 3 or state.shape[1] > self.n_ctx or state.shape[2] != self.d_model:
            raise ValueError(
                f"state must have shape [batch, pos <= {self.n_ctx}, d_model={self.d_model}] "
                f"(got {tuple(state.shape)})"
            )
        return adaptive_computation_time(
            state,
            self._transform,
            self._halting,
            max_steps=self.act_max_steps,
            epsilon=self.act_epsilon,
            signal=self._signal,
            force_halt_at_max=self.force_halt_at_max,
            accumulated=self.accumulated,
        )

    def readout(self, result: ACTResult) -> Tensor:
        """Logits ``[batch, d_out]`` at ``readout_pos``."""
        return self.ln_final(result.output[:, self.readout_pos]) @ self.W_U + self.b_U

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits ``[batch, d_out]`` (see :meth:`act` for the ponder statistics)."""
        return self.readout(self.act(tokens))


class _BankBlock(nn.Module):
    """Pre-LN block whose W_Q, W_K, W_V, W_O and MLP weights are per-example bank mixtures."""

    def __init__(self, d_model: int, n_heads: int, d_mlp: int, n_banks: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"n_heads must divide d_model (got d_model={d_model}, n_heads={n_heads})"
            )
        d_head = d_model // n_heads
        self.n_heads, self.d_head = n_heads, d_head
        K, s_in = n_banks, 1.0 / math.sqrt(d_model)
        self.W_Q = nn.Parameter(torch.randn(K, n_heads, d_model, d_head) * s_in)
        self.W_K = nn.Parameter(torch.randn(K, n_heads, d_model, d_head) * s_in)
        self.W_V = nn.Parameter(torch.randn(K, n_heads, d_model, d_head) * s_in)
        self.W_O = nn.Parameter(torch.randn(K, n_heads, d_head, d_model) / math.sqrt(d_model))
        self.W_in = nn.Parameter(torch.randn(K, d_model, d_mlp) * s_in)
        self.b_in = nn.Parameter(torch.zeros(K, d_mlp))
        self.W_out = nn.Parameter(torch.randn(K, d_mlp, d_model) / math.sqrt(d_mlp))
        self.b_out = nn.Parameter(torch.zeros(K, d_model))
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mix: Tensor) -> Tensor:
        """``x`` ``[batch, pos, d_model]``, ``mix`` ``[batch, K]`` -> ``[batch, pos, d_model]``."""
        W_Q, W_K, W_V, W_O = (
            torch.einsum("bk,k...->b...", mix, W) for W in (self.W_Q, self.W_K, self.W_V, self.W_O)
        )
        h = self.ln1(x)
        q = torch.einsum("bpm,bhmd->bhpd", h, W_Q)
        k = torch.einsum("bpm,bhmd->bhpd", h, W_K)
        v = torch.einsum("bpm,bhmd->bhpd", h, W_V)
        if autodiff_transform_active():  # no forward-AD / vmap rules for CPU SDPA
            z = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(dim=-1) @ v
        else:
            z = F.scaled_dot_product_attention(q, k, v)  # bidirectional, scale 1/sqrt(d_head)
        x = x + torch.einsum("bhpd,bhdm->bpm", z, W_O)
        W_in, W_out = mix @ self.W_in.flatten(1), mix @ self.W_out.flatten(1)
        W_in = W_in.view(-1, *self.W_in.shape[1:])
        W_out = W_out.view(-1, *self.W_out.shape[1:])
        hidden = F.gelu(torch.bmm(self.ln2(x), W_in) + (mix @ self.b_in)[:, None])
        return x + torch.bmm(hidden, W_out) + (mix @ self.b_out)[:, None]


class HyperUT(UniversalTransformer):
    """Universal Transformer + ACT whose block weights are generated per step and example.

    ``mix_t = softmax(s_t @ W_g + b_g)`` with ``s_t`` the state at ``readout_pos`` (``pool =
    "readout"``) or the mean over positions (``"mean"``); every block matrix is the mixture
    ``sum_k mix_t[k] W[k]`` of ``n_banks`` banks (SYSTEMS.md S8's default generator; the
    paper's generator is unverified). The mixture entropy (nats) of the last call is kept in
    ``last_mix_entropy`` ``[steps, batch]`` for the instruments.

    Args:
        n_banks: K >= 1.
        pool: ``"readout"`` or ``"mean"``.
        **kwargs: as :class:`UniversalTransformer`.
    Raises:
        ValueError: ``n_banks < 1`` or an unknown ``pool``; as :class:`UniversalTransformer`.
    References:
        Abnar et al. (2023), arXiv 2310.08866.
    """

    def __init__(
        self, *, n_banks: int = 4, pool: Literal["readout", "mean"] = "readout", **kwargs
    ) -> None:
        if n_banks < 1:
            raise ValueError(f"n_banks must be >= 1 (got n_banks={n_banks})")
        if pool not in ("readout", "mean"):
            raise ValueError(f"pool must be 'readout' or 'mean' (got pool={pool!r})")
        self.n_banks, self.pool = n_banks, pool
        super().__init__(**kwargs)
        self.generator = nn.Linear(self.d_model, n_banks)
        self.last_mix_entropy: Tensor | None = None
        self._entropies: list[Tensor] = []

    def _make_block(self) -> nn.Module:
        return _BankBlock(self.d_model, self.n_heads, self.d_mlp, self.n_banks)

    def _transform(self, state: Tensor, step: int) -> Tensor:
        pooled = state[:, self.readout_pos] if self.pool == "readout" else state.mean(1)
        mix = torch.softmax(self.generator(pooled), dim=-1)  # [batch, K]
        self._entropies.append(-(mix * mix.clamp_min(1e-30).log()).sum(-1).detach())
        return self.block(state, mix)

    def act_state(self, state: Tensor) -> ACTResult:
        """As :meth:`UniversalTransformer.act_state`; also sets ``last_mix_entropy``."""
        self._entropies = []
        result = super().act_state(state)
        self.last_mix_entropy = torch.stack(self._entropies)
        self._entropies = []
        return result
