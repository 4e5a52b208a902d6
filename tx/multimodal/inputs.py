"""The server's image policy: asset pointers fetched into image chunks, every image checked against the caps.

Sampling requests go through `ImageInputs.prepare` before they reach the engines, so an engine only ever
sees image bytes that were fetched under the asset rules, fit the caps and decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from tx.config.sections import AudioSection, ImagesSection
from tx.multimodal.audio import AudioLimits, check_audio_caps
from tx.multimodal.fetch import AssetPolicy, Resolver, fetch_asset, system_resolver
from tx.multimodal.images import ImageLimits, decode_image
from tx.types import AudioChunk, Chunk, ImageAssetPointer, ImageChunk, ModelInput, SampleRequest, UserError


@dataclass(frozen=True)
class ImageInputs:
    limits: ImageLimits = field(default_factory=ImageLimits)
    assets: AssetPolicy = field(default_factory=AssetPolicy)
    resolve: Resolver = system_resolver
    audio: AudioLimits = field(default_factory=AudioLimits)

    @classmethod
    def from_section(cls, section: ImagesSection, audio: AudioSection | None = None) -> ImageInputs:
        limits = ImageLimits(max_bytes=section.max_bytes, max_pixels=section.max_pixels)
        assets = AssetPolicy(
            roots=tuple(Path(root) for root in section.asset_roots),
            hosts=tuple(section.asset_hosts),
            allow_private=section.asset_allow_private,
            allowed_networks=tuple(section.asset_allowed_networks),
            max_bytes=section.max_bytes,
            timeout_s=section.asset_fetch_timeout_s,
        )
        audio_limits = AudioLimits(audio.max_frames, audio.max_bytes) if audio is not None else AudioLimits()
        return cls(limits, assets, audio=audio_limits)

    def prepare(self, model_input: ModelInput) -> ModelInput:
        """`model_input` with every asset pointer replaced by the image chunk it points to; a UserError if a
        pointer is refused or an image is over the caps or does not decode, or the clips are over theirs."""
        check_audio_caps([c for c in model_input.chunks if isinstance(c, AudioChunk)], self.audio)
        if not model_input.has_images:
            return model_input
        chunks: list[Chunk] = []
        for index, chunk in enumerate(model_input.chunks):
            try:
                chunks.append(self._prepare_chunk(chunk))
            except UserError as exc:
                raise UserError(f"chunk {index}: {exc}") from None
        return ModelInput(chunks=tuple(chunks))

    def prepare_request(self, request: SampleRequest) -> SampleRequest:
        prompt = self.prepare(request.prompt)
        return request if prompt is request.prompt else replace(request, prompt=prompt)

    def _prepare_chunk(self, chunk: Chunk) -> Chunk:
        if isinstance(chunk, ImageAssetPointer):
            data = fetch_asset(chunk.location, self.assets, self.resolve)
            chunk = ImageChunk(data=data, format=chunk.format, expected_tokens=chunk.expected_tokens)
        if isinstance(chunk, ImageChunk):
            decode_image(chunk.data, self.limits)
        return chunk
