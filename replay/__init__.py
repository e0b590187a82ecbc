"""Tasuki's replay model (SPEC §11): a model server that answers from a recorded or scripted trajectory.

It speaks the OpenAI and Ollama chat APIs (and their embeddings), so the real providers run against it.
One entry point: :func:`replay.server.serve` in a thread, ``python -m replay`` as a process.
"""

from replay.model import Answer, ReplayModel
from replay.server import ReplayServer, run_replay_model, serve
from replay.trajectory import Turn, load_trajectory, turns_from_entries

__all__ = [
    "Answer",
    "ReplayModel",
    "ReplayServer",
    "Turn",
    "load_trajectory",
    "run_replay_model",
    "serve",
    "turns_from_entries",
]
