"""Hugging Face ``Trainer`` as its docs write it, watched with no stepscope code: evaluation and a
checkpoint each epoch (``save_strategy="epoch"``). A checkpoint is the model's weights (a 64 MB
layer: ``model.safetensors``) and the optimizer's, scheduler's and RNG states (``torch.save``),
written by ``Trainer._save_checkpoint``; the script times that call itself (a subclass around
``super()``) and prints ``SAVE epoch=E seconds=S``: the truth. Planted input cost: each training
item sleeps 20 ms (workers=0): training is input-bound.
Usage: hf_trainer_checkpoint.py OUT_DIR [--epochs N]
"""

import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Shapes(Dataset):
    def __init__(self, n, load_s):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = (self.x.mean(dim=(1, 2, 3)) > 0).long()
        self.load_s = load_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.load_s)  # planted: loading one item
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
        self.table = nn.Linear(4096, 4096)  # 64 MB of weights for the checkpoint to write

    def forward(self, pixel_values, labels=None):
        logits = self.body(pixel_values)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class TimedTrainer(Trainer):
    def _save_checkpoint(self, model, trial):
        t0 = time.perf_counter()
        out = super()._save_checkpoint(model, trial)
        print(f"SAVE epoch={round(self.state.epoch)} seconds={time.perf_counter() - t0:.4f}",
              flush=True)
        return out


epochs = int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 2
args = TrainingArguments(output_dir=sys.argv[1], num_train_epochs=epochs,
                         per_device_train_batch_size=8, per_device_eval_batch_size=8,
                         eval_strategy="epoch", save_strategy="epoch", report_to=[],
                         dataloader_num_workers=0, use_cpu=True, disable_tqdm=True)
TimedTrainer(model=Net(), args=args, train_dataset=Shapes(96, 0.02),
             eval_dataset=Shapes(32, 0.0)).train()
