//! Out-of-tree test kernel modules (under testing/), built against Debian's linux-headers
//! packages for each kernel of the matrix.
