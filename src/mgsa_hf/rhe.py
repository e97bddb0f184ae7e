"""redundant-head enlivening (encoder_type="rhe")."""

from .modeling_layers import MgsaAttention


class RheAttention(MgsaAttention):
    def __init__(self, config, num_heads, is_decoder=False, is_causal=False, layer_idx=None):
        raise NotImplementedError('encoder_type="rhe" is not implemented yet.')
