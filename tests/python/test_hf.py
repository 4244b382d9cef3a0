"""Hugging Face transformers models from tiny configs (random init, no download) on
attn_implementation="libmha" against "eager": logits with padding, generate() ids
with DynamicCache and StaticCache, and no copy of q, k or v on the way in."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import libmha.hf  # noqa: E402
import libmha.torch as lt  # noqa: E402

libmha.hf.register()

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=97, max_position_embeddings=128)
DECODERS = {
    "llama": ("LlamaConfig", dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=5)),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2, use_sliding_window=True,
                                  sliding_window=6, max_window_layers=1,
                                  layer_types=["sliding_attention", "full_attention"])),
    "gemma2": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=16, sliding_window=6,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=None,
                                    query_pre_attn_scalar=16)),
    "gpt_oss": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=16, sliding_window=6,
                                     num_local_experts=4, num_experts_per_tok=2,
                                     layer_types=["sliding_attention", "full_attention"])),
    "deepseek_v3": ("DeepseekV3Config", dict(num_key_value_heads=4, q_lora_rank=None,
                                             kv_lora_rank=32, qk_rope_head_dim=8,
                                             qk_nope_head_dim=16, v_head_dim=8, n_routed_experts=4,
                                             num_experts_per_tok=2, n_group=1, topk_group=1,
                                             first_k_dense_replace=1, moe_intermediate_size=32)),
}


def build(cls_name, extra, impl, model_cls=transformers.AutoModelForCausalLM):
    torch.manual_seed(0)
    cfg = getattr(transformers, cls_name)(**SMALL, **extra)
    cfg._attn_implementation = impl
    model = model_cls.from_config(cfg, attn_implementation=impl).eval()
    return model


class CopyCount:
    """Counts the inputs libmha.torch had to copy (a last dimension not contiguous)."""

    def __init__(self, monkeypatch):
        self.calls = self.copies = 0
        inner = lt._tensor

        def counted(t, name):
            r = inner(t, name)
            self.calls += 1
            self.copies += r is not t
            return r

        monkeypatch.setattr(lt, "_tensor", counted)


def pair(name):
    cls_name, extra = DECODERS[name]
    eager = build(cls_name, extra, "eager")
    ours = build(cls_name, extra, "libmha")
    ours.load_state_dict(eager.state_dict())
    return eager, ours


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_logits_with_left_padding(name, monkeypatch):
    eager, ours = pair(name)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    copies = CopyCount(monkeypatch)
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    assert copies.calls > 0 and copies.copies == 0
    keep = mask.bool()  # padded positions' logits are not defined alike
    err = ((got - want).abs() / (1e-5 + want.abs()))[keep]
    assert torch.allclose(got[keep], want[keep], rtol=2e-5, atol=2e-5), float(err.max())


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_same_ids(name, cache):
    eager, ours = pair(name)
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    kw = dict(max_new_tokens=8, do_sample=False, attention_mask=mask, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        want = eager.generate(ids, **kw)
        got = ours.generate(ids, **kw)
    assert torch.equal(got, want)


def test_bert_with_padding(monkeypatch):
    cfg = dict(SMALL, type_vocab_size=2)
    torch.manual_seed(0)
    models = {}
    for impl in ("eager", "libmha"):
        c = transformers.BertConfig(**cfg)
        models[impl] = transformers.BertModel(c, add_pooling_layer=False)
        models[impl].set_attn_implementation(impl) if hasattr(models[impl], "set_attn_implementation") \
            else setattr(models[impl].config, "_attn_implementation", impl)
        models[impl].eval()
    models["libmha"].load_state_dict(models["eager"].state_dict())
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    copies = CopyCount(monkeypatch)
    with torch.no_grad():
        want = models["eager"](input_ids=ids, attention_mask=mask).last_hidden_state
        got = models["libmha"](input_ids=ids, attention_mask=mask).last_hidden_state
    assert copies.calls > 0 and copies.copies == 0
    keep = mask.bool()
    assert torch.allclose(got[keep], want[keep], rtol=2e-5, atol=2e-5)


def test_training_dropout_raises():
    cls_name, extra = DECODERS["llama"]
    model = build(cls_name, dict(extra, attention_dropout=0.1), "libmha").train()
    with pytest.raises(ValueError, match="inference only"):
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 4, dtype=torch.long))
