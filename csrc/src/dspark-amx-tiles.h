// What the AMX kernels (dspark-matmul-blocks.cpp: int8, dspark-matmul-amx-bf16.cpp: bf16) share:
// the tile configuration LDTILECFG reads (palette 1: up to 8 tiles of up to 16 rows x 64 bytes).
#pragma once

#include <cstdint>

struct dspark_tile_config {
    uint8_t  palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};  // bytes per row of each tile
    uint8_t  rows[16] = {};   // rows of each tile
};
