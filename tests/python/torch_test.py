"""segps from Python against real servers (separate segps-server processes
on loopback): a PyTorch module's parameters held by segps.

Run by ctest (python.torch) with PYTHONPATH=build/python and SEGPS_BIN_DIR;
skipped, with the reason, where torch or the package is absent.
"""

import json
import os
import subprocess
import tempfile
import unittest

try:
    import numpy as np
    import torch
    import segps
    import segps.local
    import segps.torch
    MISSING = None
except ImportError as error:  # reported as the skip's reason
    MISSING = str(error)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 3))


def gradient(model, x, y, set_to_none=False):
    """The cross-entropy gradient of one batch, in the module's .grad."""
    model.zero_grad(set_to_none=set_to_none)
    torch.nn.functional.cross_entropy(model(x), y).backward()


def train(ps, model, data):
    """One step a batch: pull, gradient, push."""
    for x, y in data:
        ps.pull()
        gradient(model, x, y)
        ps.push()


def batches(count, shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, *shape, generator=generator), torch.randint(0, 3, (16,), generator=generator))
            for _ in range(count)]


@unittest.skipIf(MISSING is not None, "segps.torch needs torch and the built package: %s" % MISSING)
class TorchTest(unittest.TestCase):

    def setUp(self):
        torch.manual_seed(3)
        torch.set_num_threads(1)
        self.dir = tempfile.mkdtemp(prefix="segps_python_")

    def job(self, model, name="net", extra="", **settings):
        path = os.path.join(self.dir, name + ".pbtxt")
        with open(path, "w") as out:
            out.write(segps.torch.job_config(model, name, extra=extra, **settings))
        return path

    def test_one_worker_at_staleness_0_with_sgd_equals_pytorch_alone(self):
        """Step for step within 1e-5: the servers apply SGD to the pushed
        gradients as torch.optim.SGD does to the module's own."""
        for make, shape in ((mlp, (12,)), (cnn, (1, 8, 8))):
            model = make()
            config = self.job(model, num_servers=2, optimizer="SGD", learning_rate=0.05)
            with segps.local.Servers(config, 2) as servers:
                ps = segps.torch.ParameterServers(model, config, servers.addresses, rank=0)
                ps.pull()
                alone = make()
                alone.load_state_dict(model.state_dict())
                optimizer = torch.optim.SGD(alone.parameters(), lr=0.05)
                worst = 0.0
                for x, y in batches(25, shape, seed=5):
                    # The MLP's gradients accumulate in the push buffer; the CNN's are
                    # set to None, so backward makes new ones and push copies them in.
                    gradient(model, x, y, set_to_none=make is cnn)
                    ps.push()
                    gradient(alone, x, y)
                    optimizer.step()
                    ps.pull()
                    for (name, held), mine in zip(model.named_parameters(), alone.parameters()):
                        worst = max(worst, (held - mine).abs().max().item())
                        self.assertLess(worst, 1e-5, "%s at clock %d" % (name, ps.client.clock))
                self.assertEqual(ps.client.clock, 25)
                ps.close()
                self.assertEqual(ps.client.steps, 25)
                self.check_export(config, servers, model)
                print("%s: 25 steps, largest difference from torch.optim.SGD %.3g" % (make.__name__, worst))

    def check_export(self, config, servers, model):
        """segps-export --out writes the segment's tensors as SEGMENT/NAME
        with their shapes and values; --onnx is refused, naming why."""
        out = os.path.join(self.dir, "model.safetensors")
        export = [os.path.join(os.environ["SEGPS_BIN_DIR"], "segps-export"), "--config", config,
                  "--servers", ",".join(servers.addresses)]
        subprocess.run(export + ["--out", out], check=True, capture_output=True)
        with open(out, "rb") as f:
            header_size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_size))
            data = f.read()
        for name, p in model.named_parameters():
            entry = header["net/" + name]
            self.assertEqual(entry["shape"], list(p.shape))
            begin, end = entry["data_offsets"]
            values = np.frombuffer(data[begin:end], dtype=np.float32).reshape(p.shape)
            self.assertTrue(np.array_equal(values, p.detach().numpy()), name)
        onnx = subprocess.run(export + ["--onnx", out + ".onnx"], capture_output=True, text=True)
        self.assertNotEqual(onnx.returncode, 0)
        self.assertIn('segment "net" is declared by its tensors', onnx.stderr)

    def test_the_initial_parameters_follow_pytorchs_bounds(self):
        model = mlp()
        config = self.job(model)
        with segps.local.Servers(config, 1) as servers:
            reader = segps.torch.ParameterServers(model, config, servers.addresses, rank=None)
            reader.pull()
            bound = 1 / 12 ** 0.5
            weight, bias = model[0].weight, model[0].bias
            self.assertLessEqual(weight.abs().max().item(), bound)
            self.assertLessEqual(bias.abs().max().item(), bound)
            self.assertGreater(weight.abs().max().item(), 0.8 * bound)  # spread over the range, not zeros
            self.assertGreater(weight.std().item(), 0.4 * bound)
            reader.close()

    def test_misuse_gets_a_clear_exception(self):
        model = mlp()
        config = self.job(model)
        with segps.local.Servers(config, 1) as servers:
            other = torch.nn.Sequential(torch.nn.Linear(12, 17), torch.nn.Tanh(), torch.nn.Linear(17, 3))
            with self.assertRaisesRegex(ValueError, r"tensor 0.weight of shape \[16, 12\], but the module's "
                                                    r"parameter there is 0.weight of shape \[17, 12\]"):
                segps.torch.ParameterServers(other, config, servers.addresses, rank=0)
            ps = segps.torch.ParameterServers(model, config, servers.addresses, rank=0)
            with self.assertRaisesRegex(segps.Error, "FAILED_PRECONDITION: push: pull the parameters of clock 0 "
                                                     "first") as caught:
                ps.push()
            self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
            with self.assertRaisesRegex(segps.Error, r"INVALID_ARGUMENT: rank must be 'auto' or in \[0, 1\)"):
                segps.Client(config, servers.addresses, rank=5)
            reader = segps.Client(config, servers.addresses, rank=None)
            reader.pull()
            with self.assertRaisesRegex(segps.Error, "push: a reader of net has no rank to push as"):
                reader.push(reader.pull())
            ps.close()
            with self.assertRaisesRegex(segps.Error, "pull: the session of net is closed"):
                ps.pull()
            local = subprocess.run([os.path.join(os.environ["SEGPS_BIN_DIR"], "segps-local"), "--config", config],
                                   capture_output=True, text=True)
            self.assertEqual(local.returncode, 1)
            self.assertIn('segment "net" is declared by its tensors: its workers are Python processes', local.stderr)
            with self.assertRaisesRegex(segps.Error, r"INVALID_ARGUMENT: no job config: give its file \(config\)"):
                segps.Client()
            with self.assertRaisesRegex(segps.Error, "cluster.num_servers: must be >= 1"):
                segps.check_config(text='model { segments { name: "a" tensors { name: "w" shape: 2 } } }')
            with self.assertRaisesRegex(segps.Error, r"tensors\[0\].shape: .*dimensions must be > 0"):
                segps.check_config(text='optimizer { kind: SGD learning_rate: 0.1 } cluster { num_servers: 1 } '
                                        'model { segments { name: "a" tensors { name: "w" shape: 0 } } }')

    def test_cpp_and_python_workers_train_different_segments_of_one_job(self):
        """segps-worker trains the layered segment (the walk-through's
        data) while a Python worker trains the module's, on the same servers."""
        model = mlp()
        text = segps.torch.job_config(model, "torch", num_servers=2, optimizer="ADAM", learning_rate=0.01)
        text = text.replace("model {", 'model {\n  input_width: 50 num_classes: 10\n  segments { name: "dense" '
                                       'layers { units: 10 activation: SOFTMAX } }', 1)
        text += "data { source: SYNTHETIC_SEED train_samples: 1000 test_samples: 100 }\n"
        text = text.replace("training {", "training { epochs: 2 batch_size: 50", 1)
        config = os.path.join(self.dir, "mixed.pbtxt")
        with open(config, "w") as out:
            out.write(text)
        with segps.local.Servers(config, 2) as servers:
            cpp = subprocess.Popen([os.path.join(os.environ["SEGPS_BIN_DIR"], "segps-worker"), "--config", config,
                                    "--segment", "dense", "--servers", ",".join(servers.addresses)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            ps = segps.torch.ParameterServers(model, config, servers.addresses, segment="torch", rank=0)
            train(ps, model, batches(40, (12,), seed=2))
            ps.close()
            output = cpp.communicate(timeout=120)[0]
            self.assertEqual(cpp.returncode, 0, output)
            # SYNTHETIC_SEED deals the segments halves: 500 samples, 2 epochs of 10 batches.
            self.assertIn("dense: done: 20 steps computed here (clocks 0 to 20; every server applied 20)", output)
            self.assertEqual(ps.client.steps, 40)
            dense = segps.Client(config, servers.addresses, segment="dense", rank=None)
            self.assertEqual(dense.size, 50 * 10 + 10)
            dense.close()

    def test_tls_and_tokens_as_the_cpp_worker_has_them(self):
        """Servers over mutual TLS with tokens (deploy/make-certs.sh): a
        worker with the client certificate and the worker token trains; the
        reader token reads but may not register; no token is refused."""
        certs = os.path.join(self.dir, "certs")
        subprocess.run(["bash", os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "make-certs.sh"),
                        certs], check=True, capture_output=True)
        path = lambda name: os.path.join(certs, name)
        tls = dict(tls_ca=path("ca.pem"), tls_cert=path("client.pem"), tls_key=path("client.key"))
        model = mlp()
        config = self.job(model, num_servers=2)
        server_args = ["--tls_ca", path("ca.pem"), "--tls_cert", path("server.pem"), "--tls_key", path("server.key"),
                       "--token_file", path("tokens"), "--require_client_cert"]
        with segps.local.Servers(config, 2, server_args=server_args) as servers:
            ps = segps.torch.ParameterServers(model, config, servers.addresses, rank=0,
                                              token_file=path("worker.token"), **tls)
            train(ps, model, batches(5, (12,), seed=4))
            ps.close()
            self.assertEqual(ps.client.steps, 5)
            reader = segps.Client(config, servers.addresses, rank=None, token_file=path("reader.token"), **tls)
            self.assertEqual(reader.pull().size, ps.client.size)
            reader.close()
            with self.assertRaises(segps.Error) as caught:
                segps.Client(config, servers.addresses, rank=0, token_file=path("reader.token"), **tls)
            self.assertEqual(caught.exception.code, "PERMISSION_DENIED", str(caught.exception))
            with self.assertRaises(segps.Error) as caught:
                segps.Client(config, servers.addresses, rank=0, **tls)
            self.assertEqual(caught.exception.code, "UNAUTHENTICATED", str(caught.exception))

    def train_to_clock_30(self, config, kill_at=None):
        """A worker whose batch is a function of the clock, so that a step
        computed again is the same step; the servers' parameters at the end."""
        model = mlp()
        with segps.local.Servers(config, 2, checkpoint_dir=tempfile.mkdtemp(dir=self.dir)) as servers:
            ps = segps.torch.ParameterServers(model, config, servers.addresses, rank=0)
            data = batches(4, (12,), seed=9)
            while ps.pull() < 30:
                gradient(model, *data[ps.client.clock % len(data)])
                ps.push()
                if ps.client.clock == kill_at and ps.client.recoveries == 0:
                    servers.kill(1)
                    servers.start(1)
            ps.close()
            reader = segps.Client(config, servers.addresses, rank=None)
            final = reader.pull()
            reader.close()
            return final, ps.client.recoveries

    def test_a_worker_rides_out_a_server_restart(self):
        """Server 1 killed (SIGKILL) after the push of clock 11 and started
        again on its address from its checkpoints: the C++ client rejoins,
        the servers agree where to continue (the checkpoint at clock 10),
        and the job ends bit for bit where an uninterrupted one does."""
        config = self.job(mlp(), num_servers=2, optimizer="SGD", learning_rate=0.05,
                          extra="checkpoint { every_clocks: 5 }")
        uninterrupted, none = self.train_to_clock_30(config)
        restarted, recoveries = self.train_to_clock_30(config, kill_at=12)
        self.assertEqual(none, 0)
        self.assertEqual(recoveries, 1)
        self.assertEqual(uninterrupted.tobytes(), restarted.tobytes())


if __name__ == "__main__":
    unittest.main(verbosity=2)
