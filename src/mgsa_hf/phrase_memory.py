"""MG-SA phrase memory (encoder_type="phrase_memory")."""

from .modeling_layers import MgsaAttention


class PhraseMemoryAttention(MgsaAttention):
    def __init__(self, config, num_heads, is_decoder=False, is_causal=False, layer_idx=None):
        raise NotImplementedError('encoder_type="phrase_memory" is not implemented yet.')
