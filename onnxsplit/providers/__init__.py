"""What runs a part: a session on onnxruntime's EPs, a plugin EP's device, or OpenVINO's
own runtime (``sessions``), the plugin EP libraries (``plugins``), and OpenVINO
(``openvino``)."""
