"""PR source phrase representations (encoder_type="phrase_representation")."""

from .modeling_layers import MgsaDecoderLayer, MgsaEncoderLayer


class PhraseRepresentationEncoderLayer(MgsaEncoderLayer):
    def __init__(self, config, self_attn, layer_idx):
        raise NotImplementedError('encoder_type="phrase_representation" is not implemented yet.')


class PhraseRepresentationDecoderLayer(MgsaDecoderLayer):
    def __init__(self, config, layer_idx):
        raise NotImplementedError('encoder_type="phrase_representation" is not implemented yet.')
