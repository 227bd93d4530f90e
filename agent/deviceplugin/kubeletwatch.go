package deviceplugin

import (
	"os"
)

// kubeletIdentity identifies one incarnation of kubelet.sock. A restarted kubelet removes every socket in
// its directory and creates kubelet.sock anew, so a different file (or one that appeared) means every
// resource must be served and registered again.
type kubeletIdentity struct {
	info os.FileInfo
}

func statKubelet(path string) kubeletIdentity {
	info, err := os.Stat(path)
	if err != nil {
		return kubeletIdentity{}
	}
	return kubeletIdentity{info: info}
}

func (k kubeletIdentity) present() bool { return k.info != nil }

// restartedSince says whether k is a kubelet.sock other than before (both present and not the same file,
// or present now and absent before).
func (k kubeletIdentity) restartedSince(before kubeletIdentity) bool {
	if !k.present() {
		return false
	}
	if !before.present() {
		return true
	}
	return !os.SameFile(k.info, before.info) || !k.info.ModTime().Equal(before.info.ModTime())
}
