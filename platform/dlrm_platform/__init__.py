"""dlrm-platform: Ray Data ingestion, Ray Train + TorchRec DLRM training, an RL pipeline tuner.

Importing this package starts nothing: ``ray.init`` happens only in entry points.
"""

__version__ = "0.1.0"
