# auto-generated file
import _cffi_backend

ffi = _cffi_backend.FFI('hloexec.kernels._spin_ffi',
    _version = 0x2601,
    _types = b'\x00\x00\x02\x0D\x00\x00\x02\x03\x00\x00\x17\x01\x00\x00\x17\x01\x00\x00\x17\x01\x00\x00\x00\x0F',
    _globals = (b'\x00\x00\x00\x23hlo_spin_while_equal',0,),
)
