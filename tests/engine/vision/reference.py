"""The reference a vision job's scores are compared with: plain transformers, one pair at a time.

The prompt is built here by hand from the Qwen3-VL-Reranker model card (system turn, `<Instruct>`,
`<Query>:`, `\n<Document>:`, each image as `<|vision_start|>` + one `<|image_pad|>` per merged patch +
`<|vision_end|>`), the pair's images are preprocessed together by the checkpoint's image processor
(the engine does one image at a time), and the scores are read from `Qwen3VLForConditionalGeneration`'s
full logits: none of the engine's prompt, batching or head code is used.
"""

from __future__ import annotations

import inspect
import io

import torch
from PIL import Image

SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
)
INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."


def _classes() -> dict[str, type]:
    import transformers

    return {
        "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
        "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
        "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
    }


MODEL_CLASSES = _classes()


class Reference:
    def __init__(self, path) -> None:
        from transformers import AutoConfig, AutoTokenizer

        from kafka_scorer.engine.vision.checkpoint import slow_image_processor_class

        model_class = MODEL_CLASSES[AutoConfig.from_pretrained(path).model_type]
        self.model = model_class.from_pretrained(path, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.processor = slow_image_processor_class().from_pretrained(path)
        self.image_id = self.model.config.image_token_id

    def prompt(self, query: list, document: list, instruction: str = INSTRUCTION) -> tuple[str, list]:
        """`query`/`document`: lists of str (text) and bytes (an image), in order."""
        (query_text, query_images), (document_text, document_images) = raw_prompt(query), raw_prompt(document)
        user = f"<Instruct>: {instruction}<Query>:{query_text}\n<Document>:{document_text}"
        prompt = SYSTEM + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        return prompt, query_images + document_images

    @torch.inference_mode()
    def scores(self, text: str, images: list, labels: list[int], apply_softmax: bool = False) -> list[float]:
        inputs = {}
        if images:
            processed = self.processor(images=images, return_tensors="pt")
            counts = (processed["image_grid_thw"].prod(-1) // self.processor.merge_size**2).tolist()
            pieces = text.split("<|image_pad|>")
            text = pieces[0] + "".join("<|image_pad|>" * n + rest for n, rest in zip(counts, pieces[1:]))
            inputs = {
                "pixel_values": processed["pixel_values"],
                "image_grid_thw": processed["image_grid_thw"],
            }
        encoded = self.tokenizer(text, return_tensors="pt")
        inputs.update(encoded)
        if images and "mm_token_type_ids" in inspect.signature(self.model.forward).parameters:
            inputs["mm_token_type_ids"] = (encoded["input_ids"] == self.image_id).long()
        logits = self.model(**inputs).logits[0, -1].float()
        if apply_softmax:
            return torch.softmax(logits[labels], -1).tolist()
        return torch.log_softmax(logits, -1)[labels].exp().tolist()


def raw_prompt(parts: list) -> tuple[str, list]:
    """Parts (str text, bytes an image) as the Qwen-VL prompt writes them, no template: the text with
    one image placeholder per image, and the images in order."""
    text, images = "", []
    for part in parts:
        if isinstance(part, bytes):
            images.append(Image.open(io.BytesIO(part)))
            text += "<|vision_start|><|image_pad|><|vision_end|>"
        else:
            text += part
    return text, images
