"""A tiny randomly initialised Gemma-3 text model with sliding-window layers, and a byte-level tokenizer.

Built from a config (no download, a few hundred KB), saved as a Hugging Face directory so that the real
``zyfa capture`` path (``zyfa.capture.models.load_model`` on a directory) loads it. Layer 0 is a sliding-window
layer (window ``WINDOW`` keys), layer 1 full attention; GQA 4:2, head dim 16, and a softmax scale other than
1/sqrt(head_dim) (``query_pre_attn_scalar``).
"""

from __future__ import annotations

from pathlib import Path

N_LAYERS, N_Q, N_KV, HEAD_DIM, WINDOW = 2, 4, 2, 16, 8
QUERY_PRE_ATTN_SCALAR = 32  # softmax scale 32**-0.5, not HEAD_DIM**-0.5


def byte_tokenizer():
    """A byte-level tokenizer (256 byte symbols, no merges, <bos> prepended): every text tokenizes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def tiny_gemma3_config(vocab_size: int):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_Q, num_key_value_heads=N_KV, head_dim=HEAD_DIM, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512,
        query_pre_attn_scalar=QUERY_PRE_ATTN_SCALAR, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )


def build_tiny_gemma3(path: Path, seed: int = 0) -> Path:
    """Write the tiny model and its tokenizer into ``path`` (a Hugging Face directory); return ``path``."""
    import torch
    from transformers import Gemma3ForCausalLM

    tok = byte_tokenizer()
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(tiny_gemma3_config(len(tok)))
    path = Path(path)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
