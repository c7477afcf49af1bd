"""Queue elements of the userspace shaper, one behaviour each, composed into a chain.

Like mahimahi's queues: each element is small, knows one thing (a gate, a loss process, a
serializing rate queue, a delay line) and hands packets to the next one. Elements take the
time as an argument instead of reading a clock, so tests drive them with a fake clock and the
shaper with the real one.
"""

from netem.elements.base import Element, Sink
from netem.elements.delay import DelayLine
from netem.elements.gate import Gate
from netem.elements.loss import LossProcess
from netem.elements.rate import RateQueue

__all__ = ["Element", "Sink", "Gate", "LossProcess", "RateQueue", "DelayLine"]
