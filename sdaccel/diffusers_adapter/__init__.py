"""sdaccel's engines under a diffusers pipeline the user already has: `accelerate.py` swaps the UNet and VAE calls
for an engine's stages, `lora.py` keeps diffusers' LoRA methods working on the engine's weights, `controlnet.py` runs
diffusers' ControlNet pipelines' ControlNets with the UNet."""
