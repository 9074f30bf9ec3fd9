"""Analyse a GPT-2 in one call with ``ds.inspect``: one row per layer and head.

With no argument it builds a tiny random ``transformers.GPT2LMHeadModel`` from a config (no
download); given a local Hugging Face checkpoint directory (what ``save_pretrained`` writes)
it analyses that instead, offline. Prints the per-layer means of the W_QK and W_OV effective
ranks and the attention entropy on random tokens, and writes ``inspect.csv`` to ``--out``.

Run: ``python examples/gpt2_analysis.py [CHECKPOINT_DIR] [--tokens 16] [--out DIR]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import dynascope as ds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", help="a local HF checkpoint directory")
    parser.add_argument("--tokens", type=int, default=16, help="random tokens per sequence")
    parser.add_argument("--out", default="runs/examples/gpt2_analysis")
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.checkpoint is None:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=100,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(config)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, local_files_only=True)
    x = torch.randint(0, model.config.vocab_size, (2, args.tokens))  # token ids [batch, pos]
    df = ds.inspect(model, x)
    columns = ["qk_effective_rank", "ov_effective_rank", "attention_entropy"]
    print(df.groupby("layer")[columns].mean().to_string(float_format="%.4f"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "inspect.csv", index=False)
    print(f"{len(df)} rows written to {out / 'inspect.csv'}")


if __name__ == "__main__":
    main()
