"""Our kernels inside other libraries' models. Each integration is a submodule that imports its library lazily, so
`import pytransformer` never needs them: `pytransformer.integrations.transformers` (Hugging Face transformers)."""
