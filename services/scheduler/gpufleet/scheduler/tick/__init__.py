"""The fleet tick (DESIGN §7): demand -> scale -> assign -> limits -> leases.

``decide.py`` holds the pure decisions over a snapshot; ``snapshot.py`` reads one from the
store in a few queries; ``fleet.py`` applies the decisions (intent first, then the call).
"""
