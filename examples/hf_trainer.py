"""Watch a Hugging Face ``transformers.Trainer`` run with dynascope's ``MonitorCallback``.

A tiny random GPT-2 learns a synthetic dataset (random token sequences, as its own labels).
The callback runs a ``ds.Monitor`` (W_QK spectrum probe) at step 0 and after updates, records
the Trainer's loss, learning rate and run status in a ``ds.RunStore``, and forwards the probe
values to the Trainer's own loggers (``report_to``). Prints the run's status, its recorded
losses and the mean W_QK effective rank at the first and last probed steps.

Run: ``python examples/hf_trainer.py [--steps 20] [--out runs/examples/hf_trainer]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import transformers

import dynascope as ds
from dynascope.integrations.huggingface import MonitorCallback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="runs/examples/hf_trainer")
    args = parser.parse_args()
    out = Path(args.out)

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=11, n_positions=8, n_embd=16, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 11, (32, 8), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]

    training = transformers.TrainingArguments(
        output_dir=str(out / "trainer"), max_steps=args.steps, per_device_train_batch_size=8,
        learning_rate=1e-2, logging_steps=5, report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    with ds.RunStore(out / "run") as store:
        monitor = ds.Monitor(model, [ds.probes.QKSpectrum()], ds.EveryN(5), store)
        trainer = transformers.Trainer(model=model, args=training, train_dataset=data)
        trainer.add_callback(MonitorCallback(monitor, trainer=trainer))
        trainer.remove_callback(transformers.PrinterCallback)  # keep the console short
        trainer.train()

    run = ds.load_run(out / "run")
    s = run.scalars
    print(f"status: {run.status}")
    print("trainer loss recorded in the store:")
    print(s[s["key"] == "train.loss"][["step", "value"]].to_string(index=False))
    erank = s[s["metric"] == "qk.effective_rank"].groupby("step")["value"].mean()
    first, last = erank.index.min(), erank.index.max()
    print(
        f"mean W_QK effective rank: step {first} {erank[first]:.4f}, step {last} {erank[last]:.4f}"
    )


if __name__ == "__main__":
    main()
