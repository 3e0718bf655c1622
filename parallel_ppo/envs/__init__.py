"""The envs, below the training core: the env section of the config and the rules of every field (`config.py`), what
a policy acts on (`spaces.py`) and a dict observation's packing (`observations.py`), the batch-env protocol, seeds and
levels (`batch.py`), every family in one place (`families.py`) and one module per simulator (`procgen_envs.py`,
`gym_envs.py`, `robot_envs.py`, `genesis_envs.py`). A new simulator is one module here and one entry in
`families.FAMILIES`; nothing here imports the core."""
