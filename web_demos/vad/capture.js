// AudioWorklet: hands the microphone's 16 kHz samples to the page in blocks of 512.
class VadCapture extends AudioWorkletProcessor {
  constructor() { super(); this.block = new Float32Array(512); this.filled = 0; }
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      for (let i = 0; i < channel.length; i++) {
        this.block[this.filled++] = channel[i];
        if (this.filled === this.block.length) { this.port.postMessage(this.block.slice()); this.filled = 0; }
      }
    }
    return true;
  }
}
registerProcessor("vad-capture", VadCapture);
