// Columns of a batch taken in passes, for kernels that hold a bounded number of columns' sums in
// registers. Which pass a column falls in changes nothing in how it is computed.
#pragma once

// Passes as even as they can be: n_cols in passes of at most `most` columns (9 by 8: 5 + 4, not
// 8 + 1); pass(p, first column, count) for each.
template <class F>
void dspark_balanced_passes(int n_cols, int most, F && pass) {
    const int n_passes = (n_cols + most - 1) / most;
    for (int p = 0, c0 = 0; p < n_passes; ++p) {
        const int n = (n_cols - c0) / (n_passes - p);
        pass(p, c0, n);
        c0 += n;
    }
}
