"""Small ops the decoder layers are made of (`engine/models/`), each written so that one compiled region
fuses it with its neighbours: RMSNorm with the residual add, RoPE on q and k in one pass, the gated
activation over one merged gate/up matmul, and weights merged at load."""
