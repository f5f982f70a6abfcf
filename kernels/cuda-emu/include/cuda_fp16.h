// Stand-in for CUDA's <cuda_fp16.h> in the CPU emulation: everything is in emu.h.
#include "emu.h"
