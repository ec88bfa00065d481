"""Drop-ins for Hugging Face libraries; each module imports its library on import.

* ``pasa_npu.integrations.transformers``: the ``"pasa"`` attention implementation
  (``from_pretrained(..., attn_implementation="pasa")``, ``set_attn_implementation``).
* ``pasa_npu.integrations.diffusers``: the ``"pasa"`` backend of diffusers' attention
  dispatcher (``set_attention_backend``, ``attention_backend()``) and
  ``PasaAttnProcessor`` for the classic ``Attention`` class.

``import pasa_npu`` imports neither library; install them with ``pip install 'pasa-npu[hf]'``.
"""
