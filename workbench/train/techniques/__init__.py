"""What a setting switches on the model or the step: precision policies (`precision`),
LoRA/QLoRA adapters (`lora`), activation recomputation (`recompute`) and offload
(`offload`), the attention kernel (`attention`), the tensor- and pipeline-parallel
plans of a module (`tensor_plan`, `pipeline_plan`), and Adafactor's step on FSDP2's
shards (`sharded_adafactor`)."""
