"""libmha as an attention backend of Hugging Face transformers.

    import libmha.hf
    libmha.hf.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="libmha")

register() adds "libmha" to transformers' AttentionInterface (the attention of every
layer) and to its AttentionMaskInterface (the boolean masks of transformers' sdpa
backend, True = attend, which libmha.torch maps onto key lengths, left padding,
causality at each sequence's offset and sliding windows, so that padding, DynamicCache
and StaticCache work and masked tiles are skipped). Models' GQA, sliding windows,
softcap (Gemma 2), sinks (GPT-OSS's s_aux) and dv != dk (DeepSeek-V3) go to libmha's
own fields. Inference only: a layer in training mode with dropout raises.
"""
import torch

from . import torch as _lt

NAME = "libmha"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, sliding_window=None, softcap=None, s_aux=None,
                      position_bias=None, **kwargs):
    """transformers' attention function signature: query [B, H, L, D], key and value
    [B, Hkv, S, D] and [B, Hkv, S, Dv]; returns ([B, L, H, Dv], None)."""
    if kwargs.get("output_attentions"):
        raise ValueError("libmha does not return attention weights (output_attentions)")
    L = query.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(L > 1 and attention_mask is None and is_causal)
    if position_bias is not None:  # T5-style learned biases: one additive mask
        from transformers.integrations.sdpa_attention import create_position_bias_mask

        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal,
                                                   query, key)
        is_causal = False
    args = dict(attn_mask=attention_mask, dropout_p=dropout, is_causal=is_causal, scale=scaling,
                enable_gqa=True, window=sliding_window, softcap=softcap, sinks=s_aux)
    B, H = query.shape[:2]
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and compiler.is_compiling():
        out = _lt.scaled_dot_product_attention(query, key, value, **args)
        return out.transpose(1, 2).contiguous(), None
    # written straight into the [B, L, H, Dv] layout the model reads next
    out = torch.empty((B, L, H, value.shape[3]), dtype=query.dtype)
    _lt.scaled_dot_product_attention(query, key, value, out=out.transpose(1, 2), **args)
    return out, None


def register():
    """Registers "libmha" in transformers' AttentionInterface and AttentionMaskInterface
    (idempotent)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError("libmha.hf needs Hugging Face transformers (pip install transformers): "
                          f"{e}") from None
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
