"""jaxwebrl.buffer: TensorStore ring buffer of multi-step episodes, screenshots by reference, batch assembly."""

from jaxwebrl.buffer.episodes import EpisodeError
from jaxwebrl.buffer.ring import ReadResult, RingBuffer, RingOverrun
from jaxwebrl.buffer.schema import BufferConfig, BufferFormatError, BufferWriteError
from jaxwebrl.buffer.screenshots import ScreenshotCorrupt, ScreenshotOverwritten

__all__ = ["BufferConfig", "BufferFormatError", "BufferWriteError", "EpisodeError", "ReadResult", "RingBuffer",
           "RingOverrun", "ScreenshotCorrupt", "ScreenshotOverwritten"]
