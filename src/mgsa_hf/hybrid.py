"""hybrid local/global attention (encoder_type="hybrid")."""

from .modeling_layers import MgsaAttention


class HybridAttention(MgsaAttention):
    def __init__(self, config, num_heads, is_decoder=False, is_causal=False, layer_idx=None):
        raise NotImplementedError('encoder_type="hybrid" is not implemented yet.')
