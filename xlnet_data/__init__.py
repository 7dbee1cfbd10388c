"""xlnet-data: XLNet pretraining data, identical to the original's, made fast; and a TF2 XLNet to train on it."""

__version__ = "0.1.0"
