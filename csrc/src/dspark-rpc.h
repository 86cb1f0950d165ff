// ggml's RPC backend: devices of other machines (an `rpc-server` each), added by endpoint, and
// the one thing ggml-rpc does not do for its callers: survive a server that goes away.
//
// ggml-rpc talks to each server from a dispatcher thread of its own and aborts the process when
// a connection fails. So every call into the core runs with a hook on ggml's abort:
//  - an abort raised by ggml-rpc on the calling thread (cannot connect, failed handshake) becomes
//    a dspark_error thrown there, with nothing left half-done inside ggml-rpc;
//  - one raised on a dispatcher thread (the server died while we waited for it) marks the RPC
//    servers as lost and parks that thread for good, instead of ending the process.
// Once any server has been added, C API calls run on a worker thread while the caller waits for
// either the result or a loss; on a loss the caller returns an error and the stuck worker is left
// behind. Objects placed on RPC devices refuse all further work after a loss (and are leaked on
// free, since freeing them would talk to the dead server), everything else keeps working.
#pragma once

#include "ggml-backend.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

// Connect to an rpc-server at "host:port" and register its devices; returns how many it has.
// Throws DSPARK_STATUS_UNSUPPORTED when ggml was built without RPC, DSPARK_STATUS_IO when the
// server cannot be reached, DSPARK_STATUS_INVALID_ARGUMENT for a malformed endpoint.
int32_t dspark_rpc_connect(const std::string & endpoint);

// Serve local devices to RPC clients at "host:port" until the process ends (returns only on failure,
// by throwing). `devices` empty: the CPU.
void dspark_rpc_run_server(const std::string & endpoint, const std::vector<ggml_backend_dev_t> & devices, int n_threads);

bool dspark_device_is_rpc(ggml_backend_dev_t dev);

// Throws DSPARK_STATUS_DEVICE_LOST when an RPC server was lost and any of these devices is an RPC device.
void dspark_rpc_check_alive(const std::vector<ggml_backend_dev_t> & devices);
bool dspark_rpc_lost(const std::vector<ggml_backend_dev_t> & devices);

// Install the abort hook (once; called when the backends are loaded).
void dspark_rpc_install_abort_hook();

// Run one C API call: directly while no RPC server was added, else on a worker thread so that a
// lost server cannot hang the caller. The call's result and its last error (thread-local on the
// worker) are handed back to the calling thread.
int32_t dspark_run_call(const std::function<int32_t()> & call);
