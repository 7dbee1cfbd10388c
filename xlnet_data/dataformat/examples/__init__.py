"""How a (task, pass) unit's examples are made from its task's token stream, the original's way: the rows
(layout.py), A/B pairs (pairing.py), span masks (masking.py) with the original's random streams (rng.py), in
one compiled loop (loop.py). create writes them as records; generated.py makes a cache-backed unit's again, the
same bytes, for train_gpu and dump.
"""
