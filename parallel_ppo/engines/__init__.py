"""The ways to run the core loop on more cores: `parallel` (a coordinator and worker processes over shared
memory) and `distributed` (data-parallel ranks under torchrun, behind `core.group`'s protocol)."""
