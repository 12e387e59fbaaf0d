"""jaxwebrl.buffer: TensorStore ring buffer of multi-step episodes, screenshots by reference, batch assembly."""

from jaxwebrl.buffer.episodes import EpisodeError
from jaxwebrl.buffer.ring import ReadResult, RingBuffer, RingOverrun
from jaxwebrl.buffer.schema import BufferConfig, BufferFormatError
from jaxwebrl.buffer.screenshots import ScreenshotOverwritten

__all__ = ["BufferConfig", "BufferFormatError", "EpisodeError", "ReadResult", "RingBuffer", "RingOverrun",
           "ScreenshotOverwritten"]
