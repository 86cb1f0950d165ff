// DFlash / DSpark draft models (GGUF arch "dflash").
#pragma once

struct dflash_model {};
