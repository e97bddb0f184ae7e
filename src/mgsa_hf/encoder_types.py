"""The names of the encoder types, without their code: what the command line offers before it imports a model.
`variants.VARIANTS` holds each type's [`~mgsa_hf.modeling_variant.Variant`] under the same name, in the same order."""

ENCODER_TYPES = ("transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe")
