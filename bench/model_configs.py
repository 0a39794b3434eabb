"""Model configurations shared by the end-to-end benchmarks (Llama shapes of bench/TARGETS.md)."""

MODELS = {
    # A tiny config to smoke-test the scripts on a CPU machine.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False, rope_theta=10000.0,
                 max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, head_dim=64,
                        rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
                      rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5),
}
