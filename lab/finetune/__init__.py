"""Cheaper fine-tuning at a long context, LongLoRA's two parts (Chen et al. 2024): S²-Attn in training (s2.py)
and LoRA adapters with trainable embeddings and norms (lora.py), added to train.py's run by longlora.py:
python -m lab.finetune."""
