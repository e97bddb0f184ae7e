"""What the speed benchmarks time below a whole step: a variant's own self-attention sub-layers alone, on inputs
captured from an encoder forward (`scripts/bench_layer.py`), and a training step split into its layer parts
(`scripts/profile_step.py`)."""

import statistics
import time
from collections import defaultdict

import torch

from ..modeling_syntax_inputs import SYNTAX_INPUT_NAMES, MgsaSyntaxInputs


class _Captured(Exception):
    """Stops an encoder forward once the inputs of the last timed self-attention are captured."""


class VariantAttention:
    """The part of an encoder forward that a variant changes, runnable on its own: the syntax preparation and the
    self-attention sub-layers of encoder layers `layers` (the variant's `config.variant_layers`; on a plain model,
    the same layers' plain self-attention)."""

    def __init__(self, model, layers: list[int]):
        self.model, self.layers = model, layers
        self.encoder = model.get_encoder()

    def inputs(self, batch: dict) -> tuple[list[tuple], object]:
        """`([(hidden states (B, L, D), attention mask) entering each of the self-attentions], the raw syntax)`,
        captured from one encoder forward without gradients."""
        captured = []

        def capture(module, args, kwargs):
            captured.append((args[0] if args else kwargs["hidden_states"], kwargs["attention_mask"]))
            if len(captured) == len(self.layers):
                raise _Captured  # the layers from here on are not needed

        handles = [self.encoder.layers[index].self_attn.register_forward_pre_hook(capture, with_kwargs=True)
                   for index in self.layers]
        fields = {name: batch[name] for name in SYNTAX_INPUT_NAMES if name in batch}
        try:
            with torch.no_grad():
                self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **fields)
        except _Captured:
            pass
        finally:
            for handle in handles:
                handle.remove()
        embeds = self.encoder.embed_tokens(batch["input_ids"])
        return captured, MgsaSyntaxInputs.pack(fields).with_padding(embeds, batch["attention_mask"])

    def forward(self, captured: list[tuple], syntax) -> tuple[list[torch.Tensor], torch.Tensor, float | None]:
        """The syntax preparation and the self-attentions on the captured inputs: `(each attention's output (B, L, D),
        the loss to differentiate (outputs summed, MG-SA's tag loss added), the fraction of (sentence, head) pairs RHE
        labelled important or None)`."""
        config = self.model.config
        layer_syntax = config.variant.layer_inputs(config, syntax, captured[0][0])
        outputs, loss, labels = [], 0.0, []
        for index, (hidden, mask) in zip(self.layers, captured, strict=True):
            hidden = hidden.detach().requires_grad_(self.model.training)
            output, _, contribution = self.encoder.layers[index].self_attn(hidden, attention_mask=mask,
                                                                           syntax=layer_syntax)
            outputs.append(output)
            loss = loss + output.sum()
            if contribution is not None and contribution.tag_loss is not None:
                loss = loss + contribution.tag_loss.sum()
            if contribution is not None and contribution.head_labels is not None:
                labels.append(contribution.head_labels.float().mean().item())
        return outputs, loss, statistics.mean(labels) if labels else None

    def step(self, captured: list[tuple], syntax) -> float | None:
        """Forward and backward of [`forward`]; returns RHE's important fraction (None for other variants)."""
        _, loss, important = self.forward(captured, syntax)
        loss.backward()
        self.model.zero_grad(set_to_none=True)
        return important


def layer_parts(model) -> dict[str, tuple[str, torch.nn.Module]]:
    """`{module name: (part, module)}` for the direct children of every encoder and decoder layer of a Marian-family
    model; the part (`"encoder.self_attn"`, `"decoder.phrase_combination"`, ...) is shared by the layers of a side."""
    parts = {}
    for name, module in model.named_modules():
        path = name.split(".")
        if len(path) >= 3 and path[-2].isdigit() and path[-3] == "layers":
            side = "encoder" if "encoder" in path else "decoder"
            parts[name] = (f"{side}.{path[-1]}", module)
    return parts


def profile(model, batches: list[dict], steps: int, warmup: int) -> dict:
    """Median over `steps` training steps (after `warmup`) of the forward time of each layer part, of the rest of the
    forward, of the backward pass and of the optimizer step, in milliseconds."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    spent, started = defaultdict(float), {}
    handles = []
    for name, (key, module) in layer_parts(model).items():
        def before(module, args, name=name):
            started[name] = time.perf_counter()

        def after(module, args, output, name=name, key=key):
            spent[key] += time.perf_counter() - started.pop(name)

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    records = defaultdict(list)
    model.train()
    for step in range(warmup + steps):
        spent.clear()
        batch = batches[step % len(batches)]
        start = time.perf_counter()
        loss = model(**batch).loss
        forward = time.perf_counter() - start
        start = time.perf_counter()
        loss.backward()
        backward = time.perf_counter() - start
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        update = time.perf_counter() - start
        if step < warmup:
            continue
        for key, seconds in spent.items():
            records[key].append(seconds)
        # direct children of a layer never nest, so their sum is part of the forward
        records["forward: other (embeddings, output projection and loss, residuals, dropout)"].append(
            forward - sum(spent.values()))
        records["backward"].append(backward)
        records["optimizer step"].append(update)
        records["total"].append(forward + backward + update)
    for handle in handles:
        handle.remove()
    return {key: round(1000 * statistics.median(values), 2) for key, values in sorted(records.items())}
