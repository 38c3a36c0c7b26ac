"""Tensor parallel (issue 13): Megatron-style sharding of a model over ranks (``sharding``), the processes and
their ``torch.distributed`` group (``process``), and the PyTorch tensor-parallel decoder (``tp_reference``).
Sits between ``runtime/`` and ``serve/``/``bench/`` in docs/DESIGN.md's layers."""
